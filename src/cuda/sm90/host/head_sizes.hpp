// The head sizes the Hopper kernels serve, per pass: (head_dim, value head size) pairs, each with
// its tile shapes in fwd_dispatch.cu / bwd_dispatch.cu and its instantiations in the table of
// src/CMakeLists.txt. A build may leave some out (JFA_SM90_HEAD_DIMS); they are then reported as
// not built.
#pragma once

#include <cstdio>
#include <string>

namespace jfa::sm90 {

enum class Pass { kForward, kBackward };

struct HeadSize {
  int qk;  // head_dim: columns of q and k
  int v;   // columns of v and out
};

inline constexpr HeadSize kForwardHeadSizes[] = {{32, 32},   {64, 64},   {96, 96},  {128, 128},
                                                 {192, 192}, {192, 128}, {256, 256}};
inline constexpr HeadSize kBackwardHeadSizes[] = {{32, 32},   {64, 64},   {96, 96},  {128, 128},
                                                  {192, 192}, {192, 128}, {256, 256}};

constexpr bool head_dim_built(int d) {
  switch (d) {
#ifdef JFA_SM90_BUILT_D32
    case 32:
      return true;
#endif
#ifdef JFA_SM90_BUILT_D64
    case 64:
      return true;
#endif
#ifdef JFA_SM90_BUILT_D96
    case 96:
      return true;
#endif
#ifdef JFA_SM90_BUILT_D128
    case 128:
      return true;
#endif
#ifdef JFA_SM90_BUILT_D192
    case 192:
      return true;
#endif
#ifdef JFA_SM90_BUILT_D256
    case 256:
      return true;
#endif
    default:
      return false;
  }
}

template <typename F>
void for_each_head_size(Pass pass, F&& f) {
  if (pass == Pass::kForward)
    for (const HeadSize& h : kForwardHeadSizes) f(h);
  else
    for (const HeadSize& h : kBackwardHeadSizes) f(h);
}

// Whether the pass has kernels for these sizes in this build.
inline bool has_kernels(Pass pass, int head_dim, int head_dim_v) {
  bool found = false;
  for_each_head_size(pass, [&](const HeadSize& h) {
    found |= h.qk == head_dim && h.v == head_dim_v && head_dim_built(h.qk);
  });
  return found;
}

// "32, 64, 96, 128, 192, 192/128 and 256": the sizes the pass has kernels for in this build (q.k /
// v where they differ).
inline std::string built_head_sizes(Pass pass) {
  std::string list;
  int left = 0;
  for_each_head_size(pass, [&](const HeadSize& h) { left += head_dim_built(h.qk) ? 1 : 0; });
  for_each_head_size(pass, [&](const HeadSize& h) {
    if (!head_dim_built(h.qk)) return;
    char item[32];
    if (h.qk == h.v)
      std::snprintf(item, sizeof item, "%d", h.qk);
    else
      std::snprintf(item, sizeof item, "%d/%d", h.qk, h.v);
    if (!list.empty()) list += left == 1 ? " and " : ", ";
    list += item;
    --left;
  });
  return list.empty() ? "none" : list;
}

}  // namespace jfa::sm90
