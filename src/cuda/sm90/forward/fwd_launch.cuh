// Host side of one sm90 forward configuration: tensor maps, the work-list kernel, the persistent
// attention kernel (a programmatic dependent launch of the work-list kernel where the launch
// choices ask for it). Over a paged KV cache (Cfg::kPaged, `kv` given) K and V have no tensor
// maps (maps over the pages with PagedLoads::kPagesByTma), p's cu_seqlens_k holds the sequences'
// key counts as offsets and total_k bounds their sum.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "common/params.hpp"
#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/forward/fwd_kernel.cuh"
#include "cuda/sm90/forward/fwd_work_list.cuh"
#include "cuda/sm90/forward/workspace.hpp"
#include "cuda/sm90/host/call_workspace.hpp"
#include "cuda/sm90/host/launch_error.hpp"
#include "cuda/sm90/host/offsets_check.hpp"
#include "cuda/sm90/host/shared_memory_opt_in.hpp"
#include "cuda/sm90/paged/paged_loads.hpp"
#include "cuda/sm90/shared/tensor_maps.hpp"

namespace jfa::sm90 {

// The partials of the kernels whose items hold splits of their keys (Cfg::kKeySplits).
struct KeySplitPartials {
  int32_t splits = 1;
  float* part_o = nullptr;
  float2* part_ml = nullptr;
};

template <typename Cfg>
jfa_status run_forward(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                       const LaunchChoices& launch, const jfa_paged_kv* kv = nullptr,
                       const KeySplitPartials& partials = {}) {
  using jfa::detail::fail;
  using T = typename Cfg::Element;
  static_assert(Cfg::kBlockM >= kMinBlockM, "the workspace is sized for kMinBlockM-row tiles");
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (p.total_q == 0 || p.batch == 0) return check_offsets_alone(p, stream);

  // With no keys anywhere, K/V may be NULL: point their (never used) maps at q.
  const bool no_keys = p.total_k == 0;
  const void* k = no_keys ? p.q : p.k;
  const void* v = no_keys ? p.q : p.v;
  const int64_t total_k = no_keys ? p.total_q : p.total_k;
  const int32_t heads_kv = no_keys ? p.heads_q : p.heads_kv;
  CUtensorMap tm_q, tm_k, tm_v, tm_o;
  std::string err;
  if (!encode_qkv_map<T>(p.q, p.total_q, p.heads_q, Cfg::kD, p.q_layout, Cfg::kBlockM,
                         Cfg::QTile::kBoxCols, &tm_q, &err))
    return fail(JFA_ERROR_CUDA, "tensor map encoding failed: %s", err.c_str());
  if constexpr (Cfg::kPagedTma) {
    if (kv == nullptr) return fail(JFA_ERROR_INTERNAL, "a paged kernel without its cache");
    const auto box_rows = static_cast<uint32_t>(paged_tma_box_rows(kv->page_size, Cfg::kBlockN));
    if (!encode_paged_cache_map<T>(kv->k_cache, kv->num_pages, kv->page_size, p.heads_kv, Cfg::kD,
                                   box_rows, Cfg::KTile::kBoxCols, &tm_k, &err) ||
        !encode_paged_cache_map<T>(kv->v_cache, kv->num_pages, kv->page_size, p.heads_kv, Cfg::kDv,
                                   box_rows, Cfg::VTile::kBoxCols, &tm_v, &err))
      return fail(JFA_ERROR_CUDA, "paged cache tensor map encoding failed: %s", err.c_str());
  } else if constexpr (Cfg::kPaged) {
    if (kv == nullptr) return fail(JFA_ERROR_INTERNAL, "a paged kernel without its cache");
    tm_k = tm_q;  // not read: the paged producer copies K/V itself
    tm_v = tm_q;
  } else if (!encode_qkv_map<T>(k, total_k, heads_kv, Cfg::kD, no_keys ? p.q_layout : p.k_layout,
                                Cfg::kBlockN, Cfg::KTile::kBoxCols, &tm_k, &err) ||
             !encode_qkv_map<T>(v, total_k, heads_kv, Cfg::kDv, no_keys ? p.q_layout : p.v_layout,
                                Cfg::kBlockN, Cfg::VTile::kBoxCols, &tm_v, &err)) {
    return fail(JFA_ERROR_CUDA, "tensor map encoding failed: %s", err.c_str());
  }
  // Row coordinates of the output map reach total_q + 64 (a tile past an item's end): int32.
  const int64_t ragged_rows = p.total_q + 1;
  if (ragged_rows + 64 > INT32_MAX)
    return fail(JFA_ERROR_UNSUPPORTED, "%lld query tokens: the CUDA backend takes at most %lld",
                static_cast<long long>(p.total_q), static_cast<long long>(INT32_MAX - 65));
  if (!encode_out_map<T>(p.out, p.total_q, ragged_rows, p.heads_q, Cfg::kDv, p.out_layout,
                         Cfg::OTile::kBoxCols, &tm_o, &err))
    return fail(JFA_ERROR_CUDA, "output tensor map encoding failed: %s", err.c_str());

  const int64_t capacity64 = work_list_capacity(p.total_q, p.batch, Cfg::kBlockM);
  if (capacity64 > (int64_t{1} << 30))
    return fail(JFA_ERROR_UNSUPPORTED, "batch too large for the CUDA backend (%lld tiles)",
                static_cast<long long>(capacity64));
  const int32_t capacity = static_cast<int32_t>(capacity64);
  if (const jfa_status s = opt_in_shared_memory<fwd_kernel<Cfg>>(Cfg::kSmemBytes, device.ordinal);
      s != JFA_SUCCESS)
    return s;

  CallWorkspace workspace;
  const int lists = work_lists(launch.sort_work_list);
  if (const jfa_status s =
          workspace.acquire(p, forward_workspace_bytes(p.total_q, p.batch, lists), stream);
      s != JFA_SUCCESS)
    return s;
  int32_t* count = reinterpret_cast<int32_t*>(workspace.base());
  auto* next_item = reinterpret_cast<unsigned long long*>(workspace.base() + 8);
  auto* work = reinterpret_cast<WorkListEntry*>(workspace.base() + kWorkspaceHeaderBytes);
  WorkListEntry* unsorted = launch.sort_work_list ? work + capacity : work;

  build_work_list<Cfg::kBlockM, Cfg::kBlockN, !Cfg::kPaged><<<1, kListThreads, 0, stream>>>(
      p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.total_q, p.total_k, p.causal ? 1 : 0,
      launch.sort_work_list ? 1 : 0, unsorted, work, count, next_item, capacity, p.max_seqlen_q,
      p.max_seqlen_k, Cfg::kPaged ? nullptr : p.device_check);  // paged: checked before
  if (const jfa_status s = launch_error("work-list kernel"); s != JFA_SUCCESS) return s;

  FwdArgs base{};
  static_cast<Problem&>(base) = make_problem(p, count, next_item, capacity);
  base.work = work;
  base.lse = p.lse;
  base.out_ragged_rows = static_cast<int32_t>(ragged_rows);
  base.sinks = p.sinks;
  typename Cfg::Args a{};
  if constexpr (Cfg::kLocal) {
    a = local_args(base, p);
  } else if constexpr (Cfg::kKeySplits) {
    static_cast<FwdPagedArgs&>(a) = paged_args(base, *kv);
    a.part_o = partials.part_o;
    a.part_ml = partials.part_ml;
    a.splits = partials.splits;
  } else if constexpr (Cfg::kPaged) {
    a = paged_args(base, *kv);
  } else {
    a = base;
  }

  const int64_t max_items = capacity64 * p.heads_q * (Cfg::kKeySplits ? partials.splits : 1);
  const int grid = static_cast<int>(std::min<int64_t>(device.sm_count, max_items));
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = Cfg::kSmemBytes;
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = launch.dependent_launch ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&config, fwd_kernel<Cfg>, tm_q, tm_k, tm_v, tm_o, a);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    return fail(JFA_ERROR_CUDA, "attention kernel launch failed: %s", cudaGetErrorString(e));
  return JFA_SUCCESS;
}

}  // namespace jfa::sm90
