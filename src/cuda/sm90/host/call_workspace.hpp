// The device scratch memory of one call: the caller's (checked for size and alignment), or one
// allocated in stream order and freed, in stream order, when the call is done with it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/params.hpp"
#include "common/status.hpp"

namespace jfa::sm90 {

// The alignment a caller's workspace must have (both passes).
inline constexpr size_t kWorkspaceAlignment = 16;

class CallWorkspace {
 public:
  CallWorkspace() = default;
  CallWorkspace(const CallWorkspace&) = delete;
  CallWorkspace& operator=(const CallWorkspace&) = delete;
  ~CallWorkspace() {
    if (owned_ != nullptr) cudaFreeAsync(owned_, stream_);
  }

  // `size_query`: the entry point that tells the caller the size, named when theirs is too small.
  jfa_status acquire(const jfa::detail::Params& p, size_t bytes, cudaStream_t stream,
                     const char* size_query = "jfa_attention_workspace_size") {
    using jfa::detail::fail;
    if (p.workspace != nullptr) {
      if (p.workspace_bytes < bytes)
        return fail(JFA_ERROR_INVALID_ARGUMENT,
                    "workspace_bytes is %zu but this call needs %zu (%s)", p.workspace_bytes, bytes,
                    size_query);
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

}  // namespace jfa::sm90
