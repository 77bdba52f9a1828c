// Device-side arguments of the sm90 forward (a POD passed by value next to the tensor maps): the
// call's Problem and what only the forward reads.
#pragma once

#include <cstdint>

#include "cuda/sm90/forward/workspace.hpp"
#include "cuda/sm90/shared/problem.hpp"

namespace jfa::sm90 {

struct FwdArgs : Problem {
  const WorkListEntry* work;  // built by the work-list kernel
  float* lse;                 // nullable, [heads_q, total_q]
  // The output map addresses token t of an item ending at token `end` as (R - (end - t), end) over
  // dims (head_dim, heads, R, total_q + 1), both outer dims one token apart, from a base R tokens
  // before `out`, with R = out_ragged_rows = total_q + 1: the row bound R falls on `end`, so a TMA
  // store of a tile clips at the end of its item without a map per sequence.
  int32_t out_ragged_rows;
};

}  // namespace jfa::sm90
