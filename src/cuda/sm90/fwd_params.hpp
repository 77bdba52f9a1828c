// Device-side arguments of the sm90 forward (a POD passed by value next to the tensor maps).
#pragma once

#include <cstdint>

namespace jfa::sm90 {

// One entry of the work list built on the device: q tile m_block of sequence `seq`, or (n_seqs > 1)
// one tile shared by the short sequences seq .. seq + n_seqs - 1. Each entry expands to heads_q
// work items; the q tiles of one sequence are consecutive entries, m_block descending (see
// decode_item for the order of their items).
struct WorkTile {
  int32_t seq;
  int32_t m_block;
  int32_t n_seqs;
};

struct FwdArgs {
  float* lse;  // nullable, [heads_q, total_q]
  const int32_t* cu_q;
  const int32_t* cu_k;
  const WorkTile* work;           // built by the prologue kernel
  const int32_t* work_count;      // number of valid entries of `work`
  unsigned long long* next_item;  // items claimed so far (zeroed by the prologue)
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
  int32_t schedule;  // 0: one K tile at a time per group; 1: overlapped MMAs, groups take turns;
                     // 2: overlapped MMAs, groups independent
  int32_t head_major_runs;  // 1: the order of decode_item's kHeadMajorRuns applies (non-causal)
};

}  // namespace jfa::sm90
