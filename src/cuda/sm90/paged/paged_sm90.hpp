// Entry of the Hopper forward over a paged KV cache (decode, speculative decode and chunked
// prefill: at most kPagedMaxQueryTokens query tokens per sequence), with its append (the step's new
// rows written into their pages first, paged_append.cuh): support checks, the plan, the kernels
// (the decode kernel; the packed forward's tiles for chunks under the switch of paged_prefill.hpp). The API routes calls with device
// buffers or backend=cuda here (src/api/paged_kv_api.cpp).
//
// The checked mode (params.device_check) reports cu_seqlens_q by the packed forward's q bits and
// JFA_CHECK_RESULT_NOT_FINITE as the packed forward does; the append's rules by
// JFA_PAGED_APPEND_INVALID (cu_seqlens_new breaks the rules of offsets, or a page that receives a
// sequence's new rows holds another sequence's keys); the cache's rules, which jfa.h has no bits
// for yet, take the closest k bits (a sequence's keys are seqused_k plus its new rows):
//   JFA_OFFSETS_K_DECREASING     a seqused_k entry is negative;
//   JFA_OFFSETS_K_ABOVE_MAX      a sequence's keys are more than max_pages_per_seq * page_size, or
//                                than max_seqlen_k where that hint is given;
//   JFA_OFFSETS_K_LAST_NOT_TOTAL a block_table entry of a page that holds keys is outside
//                                [0, num_pages) (keys addressed outside the cache).
// With such inputs the kernels still read and write inside every buffer (a length is clamped into
// its range, a row on a page outside the cache reads as zeros and receives no new row); their
// results are unspecified.
#pragma once

#include <cstddef>

#include "common/params.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// The forward of `p` (validated, with no packed keys: k, v and cu_seqlens_k NULL) over the cache
// `kv` (validated fields, buffers in device memory), on p.stream. No host read of device memory,
// no host synchronisation: capturable in a CUDA graph.
jfa_status paged_forward(const jfa::detail::Params& p, const jfa_paged_kv& kv);

// The workspace paged_forward needs for p's sizes and hints (batch, total_q, heads, head sizes,
// dtype, max_seqlen_q and max_seqlen_k, window.left; no pointer) on any 9.0 device: its plan's
// (paged_plan.hpp). 0 with one split, and for calls the kernels do not take (they fail before they
// allocate anything); JFA_ERROR_INVALID_ARGUMENT where the size overflows.
jfa_status paged_forward_workspace_bytes(const jfa::detail::Params& p, size_t* bytes);

}  // namespace jfa::sm90
