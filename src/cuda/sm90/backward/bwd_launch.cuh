// Host side of one sm90 backward configuration: tensor maps, then in stream order the clearing of
// the semaphores and the stored rows' bits, the work-list kernel, the preprocess (which clears the
// dQ accumulator's other rows), the persistent backward kernel (which writes the stored rows of dq
// itself) and the conversion of the other rows of dQ (and, with head splits, of dK and dV).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "common/params.hpp"
#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/backward/bwd_head_splits.hpp"
#include "cuda/sm90/backward/bwd_kernel.cuh"
#include "cuda/sm90/backward/bwd_key_grads.cuh"
#include "cuda/sm90/backward/bwd_preprocess.cuh"
#include "cuda/sm90/backward/bwd_sm90.hpp"
#include "cuda/sm90/host/call_workspace.hpp"
#include "cuda/sm90/host/launch_error.hpp"
#include "cuda/sm90/host/offsets_check.hpp"
#include "cuda/sm90/host/shared_memory_opt_in.hpp"
#include "cuda/sm90/shared/tensor_maps.hpp"

namespace jfa::sm90 {

// The backward's workspace for the call with `splits` head splits (1: none).
inline BwdWorkspaceLayout call_workspace_layout(const jfa::detail::Params& p, int32_t splits) {
  return backward_workspace_layout(
      p.total_q, p.total_k, p.batch, p.heads_q, p.head_dim,
      head_split_accumulator_floats(splits, p.total_k, p.heads_kv, p.head_dim, p.head_dim_v));
}

// Head splits for a call whose plain kernels take K tiles of `block_n` keys (bwd_head_splits.hpp):
// none where the caller's workspace was sized without the accumulators.
inline int32_t call_head_splits(const jfa::detail::BackwardParams& b, int block_n,
                                const jfa::cuda::DeviceFacts& device) {
  const jfa::detail::Params& p = b.fwd;
  const int32_t splits = chosen_head_splits(p.total_k, p.heads_kv, p.group_size(), b.deterministic,
                                            block_n, std::min(device.sm_count, kHeadSplitsMaxSms));
  if (splits > 1 && p.workspace != nullptr &&
      p.workspace_bytes < call_workspace_layout(p, splits).bytes)
    return 1;
  return splits;
}

// One backward call on Cfg's kernels; `splits` > 1 with the head-split kernels only.
template <typename Cfg>
jfa_status run_backward(const jfa::detail::BackwardParams& b, const jfa::cuda::DeviceFacts& device,
                        int32_t splits = 1) {
  using jfa::detail::fail;
  using T = typename Cfg::Element;
  const jfa::detail::Params& p = b.fwd;
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (p.batch == 0 || (p.total_q == 0 && p.total_k == 0)) {
    // No rows: the sinks' gradient is 0 (every element written).
    if (b.dsinks != nullptr) {
      const cudaError_t e = cudaMemsetAsync(b.dsinks, 0, sizeof(float) * p.heads_q, stream);
      if (e != cudaSuccess) {
        cudaGetLastError();
        return fail(JFA_ERROR_CUDA, "clearing dsinks failed: %s", cudaGetErrorString(e));
      }
    }
    return check_offsets_alone(p, stream);
  }
  const BwdWorkspaceLayout lay = call_workspace_layout(p, Cfg::kHeadSplits ? splits : 1);
  if (lay.row_len + kBwdBlockN > INT32_MAX || p.total_k + kBwdBlockN > INT32_MAX ||
      lay.list_capacity * p.heads_kv * splits > (int64_t{1} << 40))
    return fail(JFA_ERROR_UNSUPPORTED,
                "%lld query and %lld key tokens in %lld sequences: too many for the CUDA backward",
                static_cast<long long>(p.total_q), static_cast<long long>(p.total_k),
                static_cast<long long>(p.batch));

  CallWorkspace workspace;
  if (const jfa_status s =
          workspace.acquire(p, lay.bytes, stream, "jfa_attention_backward_workspace_size");
      s != JFA_SUCCESS)
    return s;
  char* base = workspace.base();
  auto* count = reinterpret_cast<int32_t*>(base);
  auto* next_item = reinterpret_cast<unsigned long long*>(base + 8);
  auto* work = reinterpret_cast<BwdListEntry*>(base + lay.list);
  auto* lse2 = reinterpret_cast<float*>(base + lay.lse2);
  auto* dpsum = reinterpret_cast<float*>(base + lay.dpsum);
  auto* sems = reinterpret_cast<int32_t*>(base + lay.sems);
  auto* stored_rows = reinterpret_cast<uint32_t*>(base + lay.stored_rows);
  auto* dq_acc = reinterpret_cast<float*>(base + lay.dq_acc);

  cudaError_t e = cudaMemsetAsync(base + lay.sems, 0, lay.zeroed_bytes(), stream);
  if (e == cudaSuccess && lay.key_grads_bytes > 0)
    e = cudaMemsetAsync(base + lay.key_grads_acc, 0, lay.key_grads_bytes, stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(JFA_ERROR_CUDA, "clearing the semaphores and stored-row bits failed: %s",
                cudaGetErrorString(e));
  }
  float* dk_acc =
      lay.key_grads_bytes > 0 ? reinterpret_cast<float*>(base + lay.key_grads_acc) : nullptr;
  float* dv_acc = dk_acc != nullptr ? dk_acc + p.total_k * p.heads_kv * Cfg::kD : nullptr;
  CUtensorMap tm_q, tm_k, tm_v, tm_do, tm_rows, tm_dk, tm_dv;
  const int64_t key_ragged_rows = p.total_k + 1;  // <= INT32_MAX - 64 by the check above
  if (p.total_k > 0) {
    // With no query rows anywhere, Q and dO are never loaded: point their maps at K.
    const bool no_rows = p.total_q == 0;
    std::string err;
    if (!encode_qkv_map<T>(no_rows ? p.k : p.q, no_rows ? p.total_k : p.total_q,
                           no_rows ? p.heads_kv : p.heads_q, Cfg::kD,
                           no_rows ? p.k_layout : p.q_layout, Cfg::kBlockM, Cfg::QTile::kBoxCols,
                           &tm_q, &err) ||
        !encode_qkv_map<T>(no_rows ? p.v : b.dout, no_rows ? p.total_k : p.total_q,
                           no_rows ? p.heads_kv : p.heads_q, Cfg::kDv,
                           no_rows ? p.v_layout : b.dout_layout, Cfg::kBlockM,
                           Cfg::DoTile::kBoxCols, &tm_do, &err) ||
        !encode_qkv_map<T>(p.k, p.total_k, p.heads_kv, Cfg::kD, p.k_layout, Cfg::kBlockN,
                           Cfg::KTile::kBoxCols, &tm_k, &err) ||
        !encode_qkv_map<T>(p.v, p.total_k, p.heads_kv, Cfg::kDv, p.v_layout, Cfg::kBlockN,
                           Cfg::VTile::kBoxCols, &tm_v, &err) ||
        !encode_out_map<T>(b.dk, p.total_k, key_ragged_rows, p.heads_kv, Cfg::kD, b.dk_layout,
                           Cfg::DkStageTile::kBoxCols, &tm_dk, &err) ||
        !encode_out_map<T>(b.dv, p.total_k, key_ragged_rows, p.heads_kv, Cfg::kDv, b.dv_layout,
                           Cfg::DvStageTile::kBoxCols, &tm_dv, &err))
      return fail(JFA_ERROR_CUDA, "tensor map encoding failed: %s", err.c_str());
    // The LSE rows of every head, then the D rows, then both shifted: one array
    // (bwd_workspace.hpp).
    if (!encode_row_terms_map(lse2, lay.row_len, kRowTermArrays * int64_t{p.heads_q},
                              Cfg::Shared::kRowTermsBox, &tm_rows, &err))
      return fail(JFA_ERROR_CUDA, "tensor map encoding failed: %s", err.c_str());
    if (const jfa_status s = opt_in_shared_memory<bwd_kernel<Cfg>>(Cfg::kSmemBytes, device.ordinal);
        s != JFA_SUCCESS)
      return s;

    build_bwd_work_list<Cfg::kBlockN><<<1, kListThreads, 0, stream>>>(
        p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.total_q, p.total_k, work, count, next_item,
        lay.list_capacity, p.max_seqlen_q, p.max_seqlen_k, p.device_check, stored_rows);
    if (const jfa_status s = launch_error("work-list kernel"); s != JFA_SUCCESS) return s;
  } else if (const jfa_status s = check_offsets_alone(p, stream); s != JFA_SUCCESS) {
    return s;  // no keys: no list kernel checks the offsets
  }

  // The per-row terms, and the dQ accumulator's rows cleared except those a shared tile stores
  // (also with no keys: dq is 0); after the offsets check, since that stores the checked mode's
  // word the kernels from here on add to.
  const dim3 tiles(static_cast<unsigned>(lay.row_len / kBwdTileRows),
                   static_cast<unsigned>(p.heads_q));
  if (p.total_q > 0) {
    bwd_preprocess<T, Cfg::kD, Cfg::kDv, Cfg::kLocal><<<tiles, kPreprocessThreads, 0, stream>>>(
        static_cast<const T*>(p.out), p.out_layout.token_stride, p.out_layout.head_stride,
        static_cast<const T*>(b.dout), b.dout_layout.token_stride, b.dout_layout.head_stride, p.lse,
        b.dlse, p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.total_q, p.total_k, p.causal ? 1 : 0,
        p.window, lay.row_len, lse2, dpsum, dq_acc, stored_rows, p.device_check);
    if (const jfa_status s = launch_error("backward preprocess"); s != JFA_SUCCESS) return s;
  }
  if (b.dsinks != nullptr) {  // p.sinks set too (validated); dsinks is 0 without query rows
    bwd_sink_gradient<<<static_cast<unsigned>(p.heads_q), kSinkThreads, 0, stream>>>(
        p.lse, dpsum, lay.row_len, p.total_q, p.sinks, b.dsinks, p.device_check);
    if (const jfa_status s = launch_error("sink gradient"); s != JFA_SUCCESS) return s;
  }

  if (p.total_k > 0) {
    BwdArgs a{};
    static_cast<Problem&>(a) = make_problem(p, count, next_item, lay.list_capacity);
    a.work = work;
    a.lse2 = lse2;
    a.dpsum = dpsum;
    a.sems = sems;
    a.dq_acc = dq_acc;
    a.row_len = lay.row_len;
    a.sem_tiles = lay.sem_tiles;
    a.key_ragged_rows = static_cast<int32_t>(key_ragged_rows);
    a.deterministic = b.deterministic ? 1 : 0;
    a.dq = b.dq;
    a.dq_token_stride = b.dq_layout.token_stride;
    a.dq_head_stride = b.dq_layout.head_stride;
    a.head_splits = splits;
    a.item_heads = p.group_size() / splits;
    a.dk_acc = dk_acc;
    a.dv_acc = dv_acc;
    typename Cfg::Args args{};
    if constexpr (Cfg::kLocal)
      args = local_args(a, p);
    else
      args = a;
    const int64_t max_items = lay.list_capacity * p.heads_kv * splits;
    const int grid = static_cast<int>(std::min<int64_t>(device.sm_count, max_items));
    bwd_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(tm_q, tm_k, tm_v, tm_do,
                                                                      tm_rows, tm_dk, tm_dv, args);
    if (const jfa_status s = launch_error("backward kernel"); s != JFA_SUCCESS) return s;
    if (dk_acc != nullptr) {
      constexpr int kTokensPerBlock = kConvertThreads / 32;
      const auto blocks = static_cast<unsigned>(std::min<int64_t>(
          (p.total_k + kTokensPerBlock - 1) / kTokensPerBlock, int64_t{device.sm_count} * 16));
      bwd_convert_key_grads<T, Cfg::kD><<<blocks, kConvertThreads, 0, stream>>>(
          dk_acc, static_cast<T*>(b.dk), b.dk_layout.token_stride, b.dk_layout.head_stride,
          p.total_k, p.heads_kv, p.softmax_scale, p.device_check);
      bwd_convert_key_grads<T, Cfg::kDv><<<blocks, kConvertThreads, 0, stream>>>(
          dv_acc, static_cast<T*>(b.dv), b.dv_layout.token_stride, b.dv_layout.head_stride,
          p.total_k, p.heads_kv, 1.f, p.device_check);
      if (const jfa_status s = launch_error("dK and dV conversion"); s != JFA_SUCCESS) return s;
    }
  }

  if (p.total_q > 0) {
    constexpr int kTokensPerBlock = kConvertThreads / 32;
    const int64_t blocks = std::min<int64_t>((p.total_q + kTokensPerBlock - 1) / kTokensPerBlock,
                                             int64_t{device.sm_count} * 16);
    bwd_convert_dq<T, Cfg::kD><<<static_cast<unsigned>(blocks), kConvertThreads, 0, stream>>>(
        dq_acc, static_cast<T*>(b.dq), b.dq_layout.token_stride, b.dq_layout.head_stride, p.total_q,
        p.heads_q, p.softmax_scale, stored_rows, p.device_check);
    if (const jfa_status s = launch_error("dQ conversion"); s != JFA_SUCCESS) return s;
  }
  return JFA_SUCCESS;
}

template <typename T, int kHeadDim, int kHeadDimV, int kRowsPerStep>
jfa_status backward_shape(const jfa::detail::BackwardParams& b,
                          const jfa::cuda::DeviceFacts& device) {
  // Windows and softcap: kernels of their own, so the plain ones carry none of it (softcap's apart
  // from the windows'). Sinks alone take the plain kernels: the LSE holds the sink, so
  // P = exp(S - LSE) has it already, and its gradient is a kernel of its own (bwd_sink_gradient).
  if (b.fwd.softcap > 0.f)
    return run_backward<BwdConfig<T, kHeadDim, kHeadDimV, kRowsPerStep, true, true>>(b, device);
  if (b.fwd.uses_window_or_softcap())
    return run_backward<BwdConfig<T, kHeadDim, kHeadDimV, kRowsPerStep, true>>(b, device);
  using Plain = BwdConfig<T, kHeadDim, kHeadDimV, kRowsPerStep>;
  if (const int32_t splits = call_head_splits(b, Plain::kBlockN, device); splits > 1)
    return run_backward<BwdConfig<T, kHeadDim, kHeadDimV, kRowsPerStep, false, false, true>>(
        b, device, splits);
  return run_backward<Plain>(b, device);
}

}  // namespace jfa::sm90
