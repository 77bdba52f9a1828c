// Device-side arguments of the sm90 backward (a POD passed by value next to the tensor maps).
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/bwd_workspace.hpp"

namespace jfa::sm90 {

struct BwdArgs {
  const int32_t* cu_q;
  const int32_t* cu_k;
  const BwdListEntry* work;       // built by the work-list kernel
  const int32_t* work_count;      // number of valid entries of `work`
  unsigned long long* next_item;  // items claimed so far (zeroed by the work-list kernel)
  const float* lse2;      // [heads_q, row_len] per query token: LSE * log2(e), +inf for none
  const float* dpsum;     // [heads_q, row_len] per query token: rowsum(dO * O) - dLSE
  int32_t* sems;          // [heads_q, sem_tiles] dQ adds done per q tile (first_sem_tile)
  float* dq_acc;          // total_q x heads_q x head_dim, see dq_acc_offset
  int32_t* device_check;  // nullable: the checked mode's word, JFA_CHECK_RESULT_NOT_FINITE ORed in
  int64_t batch;
  int64_t total_q;
  int64_t total_k;
  int64_t row_len;
  int64_t sem_tiles;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t group;  // heads_q / heads_kv
  int32_t work_capacity;
  // The ragged dK and dV maps' row bound, total_k + 1: a TMA store at rows (R - (end - first),
  // end) writes rows first .. end - 1 and clips the rest (see FwdArgs::out_ragged_rows).
  int32_t key_ragged_rows;
  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e)
  int32_t causal;
  int32_t deterministic;
  // dq itself (T): a shared tile's rows are written there directly (bwd_dq_writer).
  void* dq;
  int64_t dq_token_stride;
  int64_t dq_head_stride;
};

}  // namespace jfa::sm90
