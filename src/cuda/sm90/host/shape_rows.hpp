// The rows of the Hopper kernels' table of shapes (cuda/sm90/shapes.def) and the row a call runs:
// the one of its head size, or where the head size has several, the one with the consumer groups,
// keys per K tile or query rows per step that the choices name (forward/choices.hpp,
// backward/bwd_choices.hpp). The dispatch (fwd_dispatch.cu, bwd_dispatch.cu) and the GPU tests'
// kernel variants reach a row's instantiation through visit_forward_row / visit_backward_row, so
// that every row of the table is a shape they run.
#pragma once

#include <cstddef>
#include <iterator>
#include <type_traits>
#include <utility>

#include "common/params.hpp"
#include "cuda/sm90/backward/bwd_choices.hpp"
#include "cuda/sm90/forward/choices.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

struct ForwardShape {
  int head_dim;
  int head_dim_v;
  int groups;  // consumer warp groups, 64 q rows each
  int keys;    // keys per K tile
};

struct BackwardShape {
  int head_dim;
  int head_dim_v;
  int rows;  // query rows per step
};

inline constexpr ForwardShape kForwardShapes[] = {
#define JFA_SM90_FORWARD(d, dv, groups, keys) {d, dv, groups, keys},
#define JFA_SM90_BACKWARD(d, dv, rows)
#include "cuda/sm90/shapes.def"
#undef JFA_SM90_FORWARD
#undef JFA_SM90_BACKWARD
};
inline constexpr BackwardShape kBackwardShapes[] = {
#define JFA_SM90_FORWARD(d, dv, groups, keys)
#define JFA_SM90_BACKWARD(d, dv, rows) {d, dv, rows},
#include "cuda/sm90/shapes.def"
#undef JFA_SM90_FORWARD
#undef JFA_SM90_BACKWARD
};

// The index in kForwardShapes of the row of (head_dim, head_dim_v) with `groups` consumer groups
// if that head size's rows differ in them, and `keys` keys per K tile if they differ in those; -1
// if there is none. A head size whose rows agree on a value takes it whatever the choice names.
constexpr int forward_shape_row(int head_dim, int head_dim_v, int groups, int keys) {
  constexpr int kRows = static_cast<int>(std::size(kForwardShapes));
  int first = -1;
  bool by_groups = false, by_keys = false;
  for (int i = 0; i < kRows; ++i) {
    const ForwardShape& s = kForwardShapes[i];
    if (s.head_dim != head_dim || s.head_dim_v != head_dim_v) continue;
    if (first < 0) first = i;
    by_groups |= s.groups != kForwardShapes[first].groups;
    by_keys |= s.keys != kForwardShapes[first].keys;
  }
  for (int i = 0; i < kRows; ++i) {
    const ForwardShape& s = kForwardShapes[i];
    if (s.head_dim == head_dim && s.head_dim_v == head_dim_v &&
        (!by_groups || s.groups == groups) && (!by_keys || s.keys == keys))
      return i;
  }
  return -1;
}

// The index in kBackwardShapes of the row of (head_dim, head_dim_v) with `rows` query rows per step
// if that head size's rows differ in them; -1 if there is none.
constexpr int backward_shape_row(int head_dim, int head_dim_v, int rows) {
  constexpr int kRows = static_cast<int>(std::size(kBackwardShapes));
  int first = -1;
  bool by_rows = false;
  for (int i = 0; i < kRows; ++i) {
    const BackwardShape& s = kBackwardShapes[i];
    if (s.head_dim != head_dim || s.head_dim_v != head_dim_v) continue;
    if (first < 0) first = i;
    by_rows |= s.rows != kBackwardShapes[first].rows;
  }
  for (int i = 0; i < kRows; ++i) {
    const BackwardShape& s = kBackwardShapes[i];
    if (s.head_dim == head_dim && s.head_dim_v == head_dim_v && (!by_rows || s.rows == rows))
      return i;
  }
  return -1;
}

// The rows a call runs with the shipped choices (a tuning build may force others, fwd_dispatch.cu).
constexpr int select_forward_shape(const jfa::detail::Params& p) {
  const bool softcap = p.softcap > 0.f;
  return forward_shape_row(p.head_dim, p.head_dim_v,
                           head_dim_64_groups(p.total_q, p.batch, softcap),
                           head_dim_128_keys(p.total_q, p.batch, p.causal, softcap));
}
constexpr int select_backward_shape(const jfa::detail::Params& p) {
  return backward_shape_row(p.head_dim, p.head_dim_v, backward_rows_per_step(p.total_q, p.batch));
}

// f(std::integral_constant<std::size_t, row>{}) for the row `row` of the table, so that f can
// name the row's instantiation: kForwardShapes[decltype(r)::value] is a constant expression.
template <typename F, std::size_t... kRows>
jfa_status visit_row(int row, F& f, std::index_sequence<kRows...>) {
  jfa_status status = JFA_ERROR_INTERNAL;  // not a row of the table: the callers check first
  ((row == static_cast<int>(kRows) ? void(status = f(std::integral_constant<std::size_t, kRows>{}))
                                   : void()),
   ...);
  return status;
}
template <typename F>
jfa_status visit_forward_row(int row, F&& f) {
  return visit_row(row, f, std::make_index_sequence<std::size(kForwardShapes)>());
}
template <typename F>
jfa_status visit_backward_row(int row, F&& f) {
  return visit_row(row, f, std::make_index_sequence<std::size(kBackwardShapes)>());
}

}  // namespace jfa::sm90
