// The choice the Hopper backward makes per call: query rows per step, where a head size has rows of
// both step shapes in the table (cuda/sm90/shapes.def: 32 and 64; at 96 and up a step of two q
// tiles would need more registers than a consumer has, bwd_config.cuh).
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/bwd_workspace.hpp"

namespace jfa::sm90 {

// Steps of two q tiles, unless the sequences are at most one tile long on average: then the second
// tile would be mostly padding. The shapes decide, not the max_seqlen_q hint, so that deterministic
// mode gives the same bits for the same tensors (the two step shapes sum in different orders).
constexpr int backward_rows_per_step(int64_t total_q, int64_t batch) {
  return total_q <= kBwdTileRows * batch ? kBwdTileRows : 2 * kBwdTileRows;
}

}  // namespace jfa::sm90
