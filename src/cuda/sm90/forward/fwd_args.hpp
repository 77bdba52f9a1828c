// Device-side arguments of the sm90 forward (a POD passed by value next to the tensor maps): the
// call's Problem and what only the forward reads.
#pragma once

#include <cstdint>

#include "common/params.hpp"
#include "common/visibility.hpp"
#include "cuda/sm90/forward/workspace.hpp"
#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/shared/problem.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

struct FwdArgs : Problem {
  const WorkListEntry* work;  // built by the work-list kernel
  float* lse;                 // nullable, [heads_q, total_q]
  // The output map addresses token t of an item ending at token `end` as (R - (end - t), end) over
  // dims (head_dim, heads, R, total_q + 1), both outer dims one token apart, from a base R tokens
  // before `out`, with R = out_ragged_rows = total_q + 1: the row bound R falls on `end`, so a TMA
  // store of a tile clips at the end of its item without a map per sequence.
  int32_t out_ragged_rows;
  // nullable, [heads_q]: one logit per head in each row's denominator (epilogue.cuh's row end:
  // sinks alone take the plain kernels)
  const float* sinks;
};

// What the local-attention kernels read besides (WithLocalAttention in choices.hpp).
struct FwdLocalArgs : FwdArgs {
  jfa::detail::Window window;  // resolved: the causal mask is right = 0
  float softcap;               // 0: off, else c of c * tanh(s / c) on the scaled scores s
  float softcap_in;            // softmax_scale / softcap: the raw score's factor inside tanh
  // The scores the online softmax takes, times score_scale, are the scaled scores: the raw q.k
  // times softmax_scale, or under softcap tanh(q.k softcap_in) times the cap (folded here, so
  // that the scores need no multiply of their own).
  float score_scale;
  float score_scale_log2;  // score_scale * log2(e)
};

// What the paged kernels read besides (WithPagedKV in choices.hpp): key j of sequence b is row
// j % page_size of page block_table[b * max_pages_per_seq + j / page_size] of each cache. The
// Problem's cu_k holds the sequences' key counts as offsets (built on the device from seqused_k and
// the appended rows, paged_prefill.cu); no K or V is addressed through it.
struct FwdPagedArgs : FwdArgs {
  const void* k_cache;         // [num_pages, page_size, heads_kv, head_dim]
  const void* v_cache;         // [num_pages, page_size, heads_kv, head_dim_v]
  const int32_t* block_table;  // [batch, max_pages_per_seq]
  int64_t num_pages;
  int32_t page_size;
  int32_t page_shift;  // log2(page_size) where it is a power of two, else -1
  int32_t max_pages_per_seq;
};

// The paged kernels whose items hold splits of their keys (WithPagedKV's kKeySplits): item i is
// split i % splits of item i / splits of the work list's order, and ends in the partials of the
// paged combine kernel (paged_args.hpp's part_o, part_ml: per split and row token * heads_q +
// head, O relative to the split's maximum and (maximum in score units, sum)).
struct FwdPagedSplitArgs : FwdPagedArgs {
  float* part_o;    // [splits, total_q * heads_q, head_dim_v]
  float2* part_ml;  // [splits, total_q * heads_q]
  int32_t splits;
};

inline FwdPagedArgs paged_args(const FwdArgs& base, const jfa_paged_kv& kv) {
  FwdPagedArgs a{};
  static_cast<FwdArgs&>(a) = base;
  a.k_cache = kv.k_cache;
  a.v_cache = kv.v_cache;
  a.block_table = kv.block_table;
  a.num_pages = kv.num_pages;
  a.page_size = kv.page_size;
  a.page_shift = page_shift_of(kv.page_size);
  a.max_pages_per_seq = kv.max_pages_per_seq;
  return a;
}

inline FwdLocalArgs local_args(const FwdArgs& base, const jfa::detail::Params& p) {
  FwdLocalArgs a{};
  static_cast<FwdArgs&>(a) = base;
  a.window = p.window;
  a.softcap = p.softcap;
  a.softcap_in = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
  a.score_scale = p.softcap > 0.f ? p.softcap : p.softmax_scale;
  a.score_scale_log2 = static_cast<float>(static_cast<double>(a.score_scale) * 1.4426950408889634);
  return a;
}

}  // namespace jfa::sm90
