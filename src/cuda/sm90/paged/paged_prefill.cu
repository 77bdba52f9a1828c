// Chunked prefill over a paged KV cache on the packed forward's tiles (paged_prefill.hpp): the
// route's conditions, the key offsets, and the forward kernels WithPagedKV at head_dim 64, 128 and
// 256 (two consumer groups; 128-key tiles, 64 at 256, as the packed forward's table of shapes has
// them), both dtypes, both PagedLoads (paged_loads.hpp), with and without splits of the keys
// (paged_prefill_splits.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common/status.hpp"
#include "cuda/sm90/forward/choices.hpp"
#include "cuda/sm90/forward/fwd_config.cuh"
#include "cuda/sm90/forward/fwd_launch.cuh"
#include "cuda/sm90/forward/workspace.hpp"
#include "cuda/sm90/host/env_switch.hpp"
#include "cuda/sm90/host/launch_error.hpp"
#include "cuda/sm90/paged/paged_combine.cuh"
#include "cuda/sm90/paged/paged_head_dims.hpp"
#include "cuda/sm90/paged/paged_key_offsets.cuh"
#include "cuda/sm90/paged/paged_loads.hpp"
#include "cuda/sm90/paged/paged_prefill.hpp"
#include "cuda/sm90/paged/paged_prefill_splits.hpp"

namespace jfa::sm90 {
namespace {

using jfa::detail::fail;
using jfa::detail::Params;

// The keys of a K tile at head_dim d: 128, 64 at 256 (the packed forward's table of shapes).
constexpr int32_t prefill_block_n(int32_t d) { return d == 256 ? 64 : 128; }

template <typename T, int kD, PagedLoads kLoads, bool kKeySplits>
using PrefillConfig =
    FwdConfig<T, kD, 2, prefill_block_n(kD), WithPagedKV<ShippedKernel, kLoads, kKeySplits>>;
// The same at every head size.
constexpr int kPrefillBlockM =
    PrefillConfig<__half, 128, PagedLoads::kRowsByCpAsync, false>::kBlockM;

// JFA_CUDA_PAGED_SPLITS=0 turns the splits of the keys off (to measure them), else they are planned
// (paged_prefill_splits.hpp).
bool key_splits_off() { return env_is("JFA_CUDA_PAGED_SPLITS", "0"); }

// The loads of a call over `kv` (paged_loads.hpp; JFA_CUDA_PAGED_LOADS=rows: the row copies, to
// measure and test them where TMA would load the pages).
PagedLoads loads_of(const Params& p, const jfa_paged_kv& kv) {
  return paged_loads_for(env_is("JFA_CUDA_PAGED_LOADS", "rows"), kv.page_size, kv.num_pages,
                         prefill_block_n(p.head_dim));
}

// The (q tile, query head) items of a call by its hints (a double: no overflow), and the K tiles
// of its longest sequence.
double prefill_items(const Params& p) {
  return static_cast<double>(p.batch) * ((p.max_seqlen_q + kPrefillBlockM - 1) / kPrefillBlockM) *
         p.heads_q;
}
// The same as the splits' plan counts them (beyond a few thousand, items never split).
int64_t prefill_items_to_split(const Params& p) {
  return static_cast<int64_t>(std::min(prefill_items(p), 1e9));
}
int64_t prefill_tiles(const Params& p) {
  const int32_t block_n = prefill_block_n(p.head_dim);
  return p.max_seqlen_k > 0 ? (p.max_seqlen_k + block_n - 1) / block_n : kPrefillNoHintTiles;
}

// JFA_CUDA_PAGED_PREFILL: 1 every call the prefill kernels can take, 0 none, else by the items.
enum class PrefillSwitch { kByItems, kAlways, kNever };

PrefillSwitch prefill_switch() {
  const char* env = std::getenv("JFA_CUDA_PAGED_PREFILL");
  if (env == nullptr || env[0] == '\0') return PrefillSwitch::kByItems;
  if (env[0] == '0') return PrefillSwitch::kNever;
  if (env[0] == '1') return PrefillSwitch::kAlways;
  return PrefillSwitch::kByItems;
}

// The key offsets' bytes, rounded up so that the work list after them stays aligned.
size_t key_offsets_bytes(int64_t batch) {
  return (static_cast<size_t>(batch + 1) * sizeof(int32_t) + 255) / 256 * 256;
}

// The workspace: the key offsets, the packed forward's, then the splits' partials.
size_t partials_offset(const Params& p) {
  return (key_offsets_bytes(p.batch) + forward_workspace_bytes(p.total_q, p.batch) + 255) / 256 *
         256;
}

// The splits' partials merged into out and the LSE by the decode kernel's combine, `a` its
// arguments.
template <typename T, int kD>
jfa_status combine_splits(const Params& p, const PagedArgs& a, const KeySplitPartials& partials,
                          const jfa::cuda::DeviceFacts& device) {
  PagedArgs c = a;
  c.part_o = partials.part_o;
  c.part_ml = partials.part_ml;
  c.splits = partials.splits;
  return launch_paged_combine<T, kD>(c, device.sm_count, static_cast<cudaStream_t>(p.stream));
}

// The shapes the prefill kernels take, before the switch (decode calls stop here, without reading
// the environment).
bool prefill_shape(const Params& p) {
  return !p.uses_window_or_softcap() && p.max_seqlen_q >= kPagedPrefillMinQueryTokens;
}

}  // namespace

bool paged_prefill_may_take(const Params& p) {
  return prefill_shape(p) && prefill_switch() != PrefillSwitch::kNever;
}

bool paged_prefill_takes(const Params& p, const jfa_paged_kv& kv,
                         const jfa::cuda::DeviceFacts& device) {
  if (!prefill_shape(p) ||
      static_cast<double>(p.batch) * kv.max_pages_per_seq * kv.page_size > INT32_MAX)
    return false;
  const PrefillSwitch choice = prefill_switch();
  if (choice != PrefillSwitch::kByItems) return choice == PrefillSwitch::kAlways;
  // Pages by TMA beat the decode kernel also where the items leave SMs idle (one chunk of 256
  // tokens, 32:8 heads, 4k keys, H100: 0.082 against 0.222 ms unsplit, 0.053 split); the row
  // copies did only where the items filled them (B8 1.9x, B1 -7% to +2%).
  return loads_of(p, kv) == PagedLoads::kPagesByTma || prefill_items(p) >= device.sm_count;
}

// The partials for any device the splits plan for (the size query has none), whether or not a
// call splits.
size_t paged_prefill_workspace_bytes(const Params& p) {
  return partials_offset(p) + prefill_partials_bytes(prefill_items_to_split(p), prefill_tiles(p),
                                                     p.total_q, p.heads_q, p.head_dim_v);
}

jfa_status paged_prefill_forward(const Params& p, const jfa_paged_kv& kv, const PagedArgs& a,
                                 const jfa::cuda::DeviceFacts& device, char* workspace) {
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  auto* cu_k = reinterpret_cast<int32_t*>(workspace);
  paged_key_offsets_kernel<<<1, kListThreads, 0, stream>>>(a, cu_k);
  if (const jfa_status s = launch_error("paged key offsets kernel"); s != JFA_SUCCESS) return s;
  // The packed forward over the offsets: total_k bounds their sum (the clamps of its offsets need
  // no more); no K or V is addressed through them.
  Params pp = p;
  pp.cu_seqlens_k = cu_k;
  pp.k = nullptr;
  pp.v = nullptr;
  pp.total_k = p.batch * kv.max_pages_per_seq * kv.page_size;
  pp.workspace = workspace + key_offsets_bytes(p.batch);
  pp.workspace_bytes = forward_workspace_bytes(p.total_q, p.batch);
  const PagedLoads loads = loads_of(p, kv);
  // The splits of the keys, their partials after the forward's workspace.
  KeySplitPartials partials;
  if (!key_splits_off())
    partials.splits =
        prefill_key_splits(prefill_items_to_split(p), prefill_tiles(p), device.sm_count);
  if (partials.splits > 1) {
    const PrefillPartials at =
        prefill_partials(p.total_q, p.heads_q, p.head_dim_v, partials.splits);
    char* base = workspace + partials_offset(p);
    partials.part_o = reinterpret_cast<float*>(base);
    partials.part_ml = reinterpret_cast<float2*>(base + at.ml_offset);
  }
  auto run = [&](auto element) {
    using T = decltype(element);
    return visit_paged_head_dim(p.head_dim, [&](auto head_dim) {
      constexpr int kD = decltype(head_dim)::value;
      if (partials.splits > 1) {
        const jfa_status s =
            loads == PagedLoads::kPagesByTma
                ? run_forward<PrefillConfig<T, kD, PagedLoads::kPagesByTma, true>>(
                      pp, device, kShippedLaunch, &kv, partials)
                : run_forward<PrefillConfig<T, kD, PagedLoads::kRowsByCpAsync, true>>(
                      pp, device, kShippedLaunch, &kv, partials);
        if (s != JFA_SUCCESS) return s;
        return combine_splits<T, kD>(p, a, partials, device);
      }
      return loads == PagedLoads::kPagesByTma
                 ? run_forward<PrefillConfig<T, kD, PagedLoads::kPagesByTma, false>>(
                       pp, device, kShippedLaunch, &kv)
                 : run_forward<PrefillConfig<T, kD, PagedLoads::kRowsByCpAsync, false>>(
                       pp, device, kShippedLaunch, &kv);
    });
  };
  return p.dtype == JFA_DTYPE_FLOAT16 ? run(__half{}) : run(__nv_bfloat16{});
}

}  // namespace jfa::sm90
