// The head sizes the paged kernels take (the decode kernel and the prefill tiles alike), and the
// step from a call's head_dim to a compile-time one.
#pragma once

#include <type_traits>

#include "common/status.hpp"
#include "cuda/sm90/host/head_sizes.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

inline constexpr int kPagedHeadDims[] = {64, 128, 256};

// f(std::integral_constant<int, d>{}) for a head_dim d of kPagedHeadDims that this build has
// (nothing of the others is compiled); JFA_ERROR_INTERNAL for any other (the support checks let
// none through).
template <typename F>
jfa_status visit_paged_head_dim(int d, F&& f) {
  auto at = [&](auto head_dim) -> jfa_status {
    if constexpr (head_dim_built(decltype(head_dim)::value))
      return f(head_dim);
    else
      return jfa::detail::fail(JFA_ERROR_INTERNAL, "no paged kernel for head_dim %d in this build",
                               d);
  };
  static_assert(std::size(kPagedHeadDims) == 3, "a case below for each paged head size");
  switch (d) {
    case 64:
      return at(std::integral_constant<int, 64>{});
    case 128:
      return at(std::integral_constant<int, 128>{});
    case 256:
      return at(std::integral_constant<int, 256>{});
    default:
      return jfa::detail::fail(JFA_ERROR_INTERNAL, "no paged kernel for head_dim %d", d);
  }
}

}  // namespace jfa::sm90
