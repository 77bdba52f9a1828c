// Device-side arguments of the sm90 forward (a POD passed by value next to the tensor maps).
#pragma once

#include <cstdint>

#include "cuda/sm90/forward/workspace.hpp"

namespace jfa::sm90 {

struct FwdArgs {
  float* lse;             // nullable, [heads_q, total_q]
  int32_t* device_check;  // nullable: the checked mode's word, JFA_CHECK_RESULT_NOT_FINITE ORed in
  const int32_t* cu_q;
  const int32_t* cu_k;
  const WorkListEntry* work;      // built by the work-list kernel
  const int32_t* work_count;      // number of valid entries of `work`
  unsigned long long* next_item;  // items claimed so far (zeroed by the work-list kernel)
  int64_t batch;
  int64_t total_q;
  int64_t total_k;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t group;  // heads_q / heads_kv
  int32_t work_capacity;
  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e)
  int32_t causal;
  // The output map addresses token t of an item ending at token `end` as (R - (end - t), end) over
  // dims (head_dim, heads, R, total_q + 1), both outer dims one token apart, from a base R tokens
  // before `out`, with R = out_ragged_rows = total_q + 1: the row bound R falls on `end`, so a TMA
  // store of a tile clips at the end of its item without a map per sequence.
  int32_t out_ragged_rows;
};

}  // namespace jfa::sm90
