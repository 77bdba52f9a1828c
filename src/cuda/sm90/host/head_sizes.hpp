// The head sizes the Hopper kernels serve, per pass: the (head_dim, value head size) pairs of the
// rows of their table (cuda/sm90/shapes.def, whose rows are also the instantiations that
// src/CMakeLists.txt generates and the tile shapes the dispatch picks from). A build may leave
// some out (JFA_SM90_HEAD_DIMS); they are then reported as not built.
#pragma once

#include <array>
#include <cstddef>
#include <cstdio>
#include <string>

namespace jfa::sm90 {

enum class Pass { kForward, kBackward };

struct HeadSize {
  int qk;  // head_dim: columns of q and k
  int v;   // columns of v and out
};

// The (head_dim, value head size) of each row of the table, per pass, in the table's order.
inline constexpr HeadSize kForwardRows[] = {
#define JFA_SM90_FORWARD(d, dv, groups, keys) {d, dv},
#define JFA_SM90_BACKWARD(d, dv, rows)
#include "cuda/sm90/shapes.def"
#undef JFA_SM90_FORWARD
#undef JFA_SM90_BACKWARD
};
inline constexpr HeadSize kBackwardRows[] = {
#define JFA_SM90_FORWARD(d, dv, groups, keys)
#define JFA_SM90_BACKWARD(d, dv, rows) {d, dv},
#include "cuda/sm90/shapes.def"
#undef JFA_SM90_FORWARD
#undef JFA_SM90_BACKWARD
};

// The rows' pairs, each once, in the order of their first row.
template <std::size_t N>
constexpr std::size_t distinct_head_sizes(const HeadSize (&rows)[N]) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < N; ++i) {
    bool seen = false;
    for (std::size_t j = 0; j < i; ++j) seen |= rows[j].qk == rows[i].qk && rows[j].v == rows[i].v;
    n += seen ? 0 : 1;
  }
  return n;
}
template <std::size_t M, std::size_t N>
constexpr std::array<HeadSize, M> head_sizes_of(const HeadSize (&rows)[N]) {
  std::array<HeadSize, M> sizes{};
  std::size_t n = 0;
  for (std::size_t i = 0; i < N; ++i) {
    bool seen = false;
    for (std::size_t j = 0; j < n; ++j)
      seen |= sizes[j].qk == rows[i].qk && sizes[j].v == rows[i].v;
    if (!seen) sizes[n++] = rows[i];
  }
  return sizes;
}

inline constexpr auto kForwardHeadSizes =
    head_sizes_of<distinct_head_sizes(kForwardRows)>(kForwardRows);
inline constexpr auto kBackwardHeadSizes =
    head_sizes_of<distinct_head_sizes(kBackwardRows)>(kBackwardRows);

// The head_dims this build has kernels for (JFA_SM90_HEAD_DIMS): src/CMakeLists.txt passes them as
// JFA_SM90_BUILT_HEAD_DIM_BITS, bit d / 8 for head_dim d (a list would not survive nvcc's -D,
// which splits at commas); none where it passes nothing (code outside the library).
#ifndef JFA_SM90_BUILT_HEAD_DIM_BITS
#define JFA_SM90_BUILT_HEAD_DIM_BITS 0
#endif

constexpr bool head_dim_built(int d) {
  return d > 0 && d % 8 == 0 && d / 8 < 64 &&
         ((static_cast<unsigned long long>(JFA_SM90_BUILT_HEAD_DIM_BITS) >> (d / 8)) & 1u) != 0;
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
