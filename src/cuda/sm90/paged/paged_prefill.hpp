// Chunked prefill over a paged KV cache on the packed forward's tiles: the forward kernel with
// WithPagedKV (its producer copies K/V from the pages, producer_paged.cuh), 128 or more query rows
// a tile, where the decode kernel (paged_decode.cuh) runs 16 to 64 rows of a KV head's query group
// a CTA and each row block reads the sequence's keys again. The sequences' key counts become
// offsets on the device first (paged_key_offsets.cuh), in the call's workspace. Taken where the
// (q tile, query head) items fill the SMs; with fewer, the decode kernel, which splits along the
// keys, is as fast or faster (measured on an H100: chunks of 256 tokens, 32:8 heads, 4k and 8k
// keys: B8 1.9x faster here, B1 within -7% to +2%). JFA_CUDA_PAGED_PREFILL (read per call): 1
// takes them for every call they can take, 0 for none (to test and measure either path). Built for
// measurement beside them, taken only where asked (bf16 at 64 and 128): other loads of the pages
// (JFA_CUDA_UNVERIFIED_PAGED_LOADS, paged_loads.hpp) and splits of the keys where the items leave
// SMs idle (JFA_CUDA_UNVERIFIED_PAGED_SPLITS=1, paged_prefill_splits.hpp).
#pragma once

#include <cstddef>

#include "common/params.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/paged/paged_args.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// The fewest query tokens (max_seqlen_q, the hint) a call must allow for the prefill kernels: below
// it the decode kernel's packing of the query group into its rows reads each key fewer times.
inline constexpr int32_t kPagedPrefillMinQueryTokens = 64;

// Whether p's sizes and hints (no cache), of a call the paged kernels take (its dtype and head
// sizes checked by paged_dispatch.cu), may take the prefill kernels: not switched off, no window
// beyond the causal mask and no softcap (sinks are taken), max_seqlen_q at least
// kPagedPrefillMinQueryTokens. The workspace size query asks this.
bool paged_prefill_may_take(const jfa::detail::Params& p);

// Whether the call takes them: paged_prefill_may_take, the cache's key capacity over the batch
// (batch * max_pages_per_seq * page_size) in int32, the offsets' type, and (unless switched on for
// every call) at least one (q tile, query head) item per SM by the hints.
bool paged_prefill_takes(const jfa::detail::Params& p, const jfa_paged_kv& kv,
                         const jfa::cuda::DeviceFacts& device);

// Its workspace: the key offsets, then the packed forward's work list (and, splits asked, their
// partials).
size_t paged_prefill_workspace_bytes(const jfa::detail::Params& p);

// The forward of `p` over `kv` (after the checked mode's kernels and the append, on p.stream), `a`
// the decode kernels' arguments (the key counts' inputs), in `workspace` of
// paged_prefill_workspace_bytes(p).
jfa_status paged_prefill_forward(const jfa::detail::Params& p, const jfa_paged_kv& kv,
                                 const PagedArgs& a, const jfa::cuda::DeviceFacts& device,
                                 char* workspace);

}  // namespace jfa::sm90
