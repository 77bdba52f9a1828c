// Host side of the sm90 forward: tensor maps, work-list prologue, persistent launch.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "api/error.hpp"
#include "cuda/common/tensor_map.hpp"
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/sm90/fwd_sm90.hpp"
#include "cuda/sm90/tuning_switch.hpp"
#include "cuda/sm90/workspace.hpp"

namespace jfa::sm90 {

namespace launch_detail {

template <typename T>
CUtensorMapDataType map_dtype() {
  return std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// Map over a packed [total, heads, d] tensor: dims (d, heads, total), box (64, 1, rows).
template <typename T>
bool encode_qkv_map(const void* base, int64_t total, int32_t heads, int32_t d,
                    const jfa::detail::Layout& layout, uint32_t rows, CUtensorMap* map,
                    std::string* error) {
  jfa::cuda::TiledMapSpec spec;
  spec.dtype = map_dtype<T>();
  spec.rank = 3;
  spec.base = base;
  spec.dims[0] = static_cast<uint64_t>(d);
  spec.dims[1] = static_cast<uint64_t>(heads);
  spec.dims[2] = static_cast<uint64_t>(std::max<int64_t>(total, 1));
  spec.strides[0] = static_cast<uint64_t>(layout.head_stride) * sizeof(T);
  spec.strides[1] = static_cast<uint64_t>(layout.token_stride) * sizeof(T);
  spec.box[0] = 64;
  spec.box[1] = 1;
  spec.box[2] = rows;
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  return jfa::cuda::encode_tiled_map(spec, map, error);
}

// The ragged output map (see FwdArgs::out_ragged_rows): dims (d, heads, rows, total + 1), both
// outer dims one token apart, box (64, 1, 64, 1), based `rows` tokens before `out` (never
// dereferenced there: every stored element lies inside the item's rows).
template <typename T>
bool encode_out_map(void* out, int64_t total, int64_t rows, int32_t heads, int32_t d,
                    const jfa::detail::Layout& layout, CUtensorMap* map, std::string* error) {
  jfa::cuda::TiledMapSpec spec;
  spec.dtype = map_dtype<T>();
  spec.rank = 4;
  const uint64_t before = static_cast<uint64_t>(rows * layout.token_stride) * sizeof(T);
  if (reinterpret_cast<uintptr_t>(out) < before) {
    *error = "the output lies too low in the address space for the ragged output map";
    return false;
  }
  spec.base = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(out) - before);
  spec.dims[0] = static_cast<uint64_t>(d);
  spec.dims[1] = static_cast<uint64_t>(heads);
  spec.dims[2] = static_cast<uint64_t>(rows);
  spec.dims[3] = static_cast<uint64_t>(total + 1);
  spec.strides[0] = static_cast<uint64_t>(layout.head_stride) * sizeof(T);
  spec.strides[1] = static_cast<uint64_t>(layout.token_stride) * sizeof(T);
  spec.strides[2] = static_cast<uint64_t>(layout.token_stride) * sizeof(T);
  spec.box[0] = 64;
  spec.box[1] = 1;
  spec.box[2] = 64;
  spec.box[3] = 1;
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  return jfa::cuda::encode_tiled_map(spec, map, error);
}

// Mainloop schedule (see FwdArgs::schedule): the overlapped one with the groups taking turns (1,
// measured fastest) unless JFA_SM90_SCHEDULE asks for another (a tuning switch; all compute the
// same function).
inline int schedule_choice() { return tuning_switch(TuningSwitch::kSchedule, 1); }

// Work-list order (a tuning switch): sequence order, measured faster with both the round-robin
// walk and the dynamic items, unless JFA_SM90_LPT=1 asks for heaviest sequences first.
inline int lpt_order() { return tuning_switch(TuningSwitch::kLpt, 0); }

// Item order without the causal mask (a tuning switch): head-major runs (decode_item) unless
// JFA_SM90_HEAD_MAJOR=0 asks for the tile-major order.
inline int head_major_runs() { return tuning_switch(TuningSwitch::kHeadMajor, 1); }

// The forward kernel as a programmatic dependent of the work-list kernel (it sets up while the list
// is built) unless JFA_SM90_PDL=0 asks for two plain launches (a tuning switch).
inline bool dependent_launch() { return tuning_switch(TuningSwitch::kPdl, 1) != 0; }

// The device scratch memory of one call: the caller's (checked for size and alignment), or one
// allocated in stream order and freed, in stream order, when the call is done with it.
class CallWorkspace {
 public:
  CallWorkspace() = default;
  CallWorkspace(const CallWorkspace&) = delete;
  CallWorkspace& operator=(const CallWorkspace&) = delete;
  ~CallWorkspace() {
    if (owned_ != nullptr) cudaFreeAsync(owned_, stream_);
  }

  jfa_status acquire(const jfa::detail::Params& p, size_t bytes, cudaStream_t stream) {
    using jfa::detail::fail;
    if (p.workspace != nullptr) {
      if (p.workspace_bytes < bytes)
        return fail(JFA_ERROR_INVALID_ARGUMENT,
                    "workspace_bytes is %zu but this call needs %zu "
                    "(jfa_attention_workspace_size)",
                    p.workspace_bytes, bytes);
      if (reinterpret_cast<uintptr_t>(p.workspace) % kWorkspaceAlignment != 0)
        return fail(JFA_ERROR_INVALID_ARGUMENT, "workspace must be %zu-byte aligned",
                    kWorkspaceAlignment);
      base_ = p.workspace;
      return JFA_SUCCESS;
    }
    const cudaError_t e = cudaMallocAsync(&owned_, bytes, stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      owned_ = nullptr;
      return fail(e == cudaErrorMemoryAllocation ? JFA_ERROR_OUT_OF_MEMORY : JFA_ERROR_CUDA,
                  "cudaMallocAsync of the %zu-byte workspace failed: %s", bytes,
                  cudaGetErrorString(e));
    }
    stream_ = stream;
    base_ = owned_;
    return JFA_SUCCESS;
  }

  char* base() const { return static_cast<char*>(base_); }

 private:
  void* base_ = nullptr;
  void* owned_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace launch_detail

template <typename T, int kHeadDim, int kGroups, int kKeys>
jfa_status run_forward(const jfa::detail::Params& p, const DeviceFacts& device) {
  using jfa::detail::fail;
  using Cfg = FwdConfig<T, kHeadDim, kGroups, kKeys>;
  static_assert(Cfg::kBlockM >= kMinBlockM, "the workspace is sized for kMinBlockM-row tiles");
  if (p.total_q == 0 || p.batch == 0) return JFA_SUCCESS;
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);

  // With no keys anywhere, K/V may be NULL: point their (never used) maps at q.
  const bool no_keys = p.total_k == 0;
  CUtensorMap tm_q, tm_k, tm_v;
  std::string err;
  if (!launch_detail::encode_qkv_map<T>(p.q, p.total_q, p.heads_q, kHeadDim, p.q_layout,
                                        Cfg::kBlockM, &tm_q, &err) ||
      !launch_detail::encode_qkv_map<T>(
          no_keys ? p.q : p.k, no_keys ? p.total_q : p.total_k, no_keys ? p.heads_q : p.heads_kv,
          kHeadDim, no_keys ? p.q_layout : p.k_layout, Cfg::kBlockN, &tm_k, &err) ||
      !launch_detail::encode_qkv_map<T>(
          no_keys ? p.q : p.v, no_keys ? p.total_q : p.total_k, no_keys ? p.heads_q : p.heads_kv,
          kHeadDim, no_keys ? p.q_layout : p.v_layout, Cfg::kBlockN, &tm_v, &err))
    return fail(JFA_ERROR_CUDA, "tensor map encoding failed: %s", err.c_str());
  // Row coordinates of the output map reach total_q + 64 (a tile past an item's end): int32.
  const int64_t ragged_rows = p.total_q + 1;
  if (ragged_rows + 64 > INT32_MAX)
    return fail(JFA_ERROR_UNSUPPORTED, "%lld query tokens: the CUDA backend takes at most %lld",
                static_cast<long long>(p.total_q), static_cast<long long>(INT32_MAX - 65));
  CUtensorMap tm_o;
  if (!launch_detail::encode_out_map<T>(p.out, p.total_q, ragged_rows, p.heads_q, kHeadDim,
                                        p.out_layout, &tm_o, &err))
    return fail(JFA_ERROR_CUDA, "output tensor map encoding failed: %s", err.c_str());

  const int64_t capacity64 = work_list_capacity(p.total_q, p.batch, Cfg::kBlockM);
  if (capacity64 > (int64_t{1} << 30))
    return fail(JFA_ERROR_UNSUPPORTED, "batch too large for the CUDA backend (%lld tiles)",
                static_cast<long long>(capacity64));
  const int32_t capacity = static_cast<int32_t>(capacity64);

  {
    // The shared-memory opt-in is per device; remember where it was done.
    static std::atomic<bool> attr_done[64];
    const int dev = device.ordinal;
    if (dev < 0 || dev >= 64 || !attr_done[dev].load(std::memory_order_acquire)) {
      const cudaError_t ae = cudaFuncSetAttribute(
          fwd_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
      if (ae != cudaSuccess) {
        cudaGetLastError();
        return fail(JFA_ERROR_CUDA, "cudaFuncSetAttribute (%d bytes of shared memory) failed: %s",
                    Cfg::kSmemBytes, cudaGetErrorString(ae));
      }
      if (dev >= 0 && dev < 64) attr_done[dev].store(true, std::memory_order_release);
    }
  }

  launch_detail::CallWorkspace workspace;
  if (const jfa_status s =
          workspace.acquire(p, forward_workspace_bytes(p.total_q, p.batch), stream);
      s != JFA_SUCCESS)
    return s;
  int32_t* count = reinterpret_cast<int32_t*>(workspace.base());
  auto* next_item = reinterpret_cast<unsigned long long*>(workspace.base() + 8);
  WorkTile* work = reinterpret_cast<WorkTile*>(workspace.base() + kWorkspaceHeaderBytes);
  WorkTile* list = work + capacity;  // the unsorted list

  build_work_list<Cfg::kBlockM, Cfg::kBlockN><<<1, kListThreads, 0, stream>>>(
      p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.total_q, p.total_k, p.causal ? 1 : 0,
      launch_detail::lpt_order(), list, work, count, next_item, capacity);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return fail(JFA_ERROR_CUDA, "work-list kernel launch failed: %s", cudaGetErrorString(e));

  FwdArgs a{};
  a.lse = p.lse;
  a.cu_q = p.cu_seqlens_q;
  a.cu_k = p.cu_seqlens_k;
  a.work = work;
  a.work_count = count;
  a.next_item = next_item;
  a.batch = p.batch;
  a.total_q = p.total_q;
  a.total_k = p.total_k;
  a.heads_q = p.heads_q;
  a.head_major_runs = launch_detail::head_major_runs();
  a.heads_kv = p.heads_kv;
  a.group = p.heads_q / p.heads_kv;
  a.work_capacity = capacity;
  a.softmax_scale = p.softmax_scale;
  a.scale_log2 = static_cast<float>(static_cast<double>(p.softmax_scale) * 1.4426950408889634);
  a.causal = p.causal ? 1 : 0;
  a.out_ragged_rows = static_cast<int32_t>(ragged_rows);
  a.schedule = launch_detail::schedule_choice();

  const int64_t max_items = capacity64 * p.heads_q;
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
  config.numAttrs = launch_detail::dependent_launch() ? 1 : 0;
  e = cudaLaunchKernelEx(&config, fwd_kernel<Cfg>, tm_q, tm_k, tm_v, tm_o, a);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    return fail(JFA_ERROR_CUDA, "attention kernel launch failed: %s", cudaGetErrorString(e));
  return JFA_SUCCESS;
}

}  // namespace jfa::sm90
