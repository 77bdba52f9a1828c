// Device-side arguments of the sm90 backward (a POD passed by value next to the tensor maps): the
// call's Problem and what only the backward reads.
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/bwd_workspace.hpp"
#include "cuda/sm90/shared/problem.hpp"

namespace jfa::sm90 {

struct BwdArgs : Problem {
  const BwdListEntry* work;  // built by the work-list kernel
  const float* lse2;         // [heads_q, row_len] per query token: LSE * log2(e), +inf for none
  const float* dpsum;        // [heads_q, row_len] per query token: rowsum(dO * O) - dLSE
  int32_t* sems;             // [heads_q, sem_tiles] dQ adds done per q tile (first_sem_tile)
  float* dq_acc;             // total_q x heads_q x head_dim, see dq_acc_offset
  int64_t row_len;
  int64_t sem_tiles;
  // The ragged dK and dV maps' row bound, total_k + 1: a TMA store at rows (R - (end - first),
  // end) writes rows first .. end - 1 and clips the rest (see FwdArgs::out_ragged_rows).
  int32_t key_ragged_rows;
  int32_t deterministic;
  // dq itself (T): a shared tile's rows are written there directly (bwd_dq_writer).
  void* dq;
  int64_t dq_token_stride;
  int64_t dq_head_stride;
};

}  // namespace jfa::sm90
