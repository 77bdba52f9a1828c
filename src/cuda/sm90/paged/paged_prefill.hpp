// Chunked prefill over a paged KV cache on the packed forward's tiles: the forward kernel with
// WithPagedKV, 128 or more query rows a tile, where the decode kernel (paged_decode.cuh) runs 16 to
// 64 rows of a KV head's query group a CTA and each row block reads the sequence's keys again. Its
// producer loads whole pages by TMA where they come in boxes of 8 rows or more
// (producer_paged_tma.cuh), else copies rows by cp.async (producer_paged.cuh; paged_loads.hpp
// chooses); where the (q tile, query head) items leave SMs idle, each item's keys are split and
// the splits' partials combined (paged_prefill_splits.hpp). The sequences' key counts become
// offsets on the device first (paged_key_offsets.cuh), in the call's workspace. Taken for every
// call of at least kPagedPrefillMinQueryTokens query tokens by the hint where the pages come by TMA
// (measured on an H100, chunks of 256 tokens, 32:8 heads, 4k keys, bf16: B1 4.2x and B8 2.2x the
// decode kernel at head_dim 128), and with row copies only where the items fill the SMs (B8 1.9x;
// B1 within -7% to +2%). Switches read per call, to test and measure each path:
// JFA_CUDA_PAGED_PREFILL 1 takes them for every call they can take, 0 for none;
// JFA_CUDA_PAGED_LOADS=rows the row copies everywhere; JFA_CUDA_PAGED_SPLITS=0 no splits.
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
// every call) pages loaded by TMA or at least one (q tile, query head) item per SM by the hints.
bool paged_prefill_takes(const jfa::detail::Params& p, const jfa_paged_kv& kv,
                         const jfa::cuda::DeviceFacts& device);

// Its workspace: the key offsets, then the packed forward's work list, then the partials of the
// most splits a device may plan for these shapes.
size_t paged_prefill_workspace_bytes(const jfa::detail::Params& p);

// The forward of `p` over `kv` (after the checked mode's kernels and the append, on p.stream), `a`
// the decode kernels' arguments (the key counts' inputs), in `workspace` of
// paged_prefill_workspace_bytes(p).
jfa_status paged_prefill_forward(const jfa::detail::Params& p, const jfa_paged_kv& kv,
                                 const PagedArgs& a, const jfa::cuda::DeviceFacts& device,
                                 char* workspace);

}  // namespace jfa::sm90
