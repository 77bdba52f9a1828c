// The CUDA kernels of each GPU architecture this build holds, as the API calls them. The API asks
// for the backend that serves the current device and calls through it, so that the kernels of a
// later architecture (an sm100/ beside sm90/) are one more entry of the list, not a change to the
// API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/params.hpp"
#include "jfa/jfa.h"

namespace jfa::cuda {

struct GpuBackend {
  const char* name;  // the kernels' folder, e.g. "sm90"
  int major, minor;  // the compute capability they run on
  // Each checks what its kernels take (dtype, head sizes, alignment) and fails with
  // JFA_ERROR_UNSUPPORTED and a message otherwise.
  jfa_status (*forward)(const jfa::detail::Params& p);
  jfa_status (*backward)(const jfa::detail::BackwardParams& b);
  // The caller's workspace a call with these shapes needs.
  size_t (*forward_workspace_bytes)(int64_t total_q, int64_t batch);
  size_t (*backward_workspace_bytes)(const jfa::detail::BackwardSizes& sizes);
  // The forward over a paged KV cache (p without packed keys; kv's fields validated), or NULL
  // where the architecture has no paged kernels.
  jfa_status (*paged_forward)(const jfa::detail::Params& p, const jfa_paged_kv& kv);
  // The caller's workspace a paged call needs, from p's sizes and hints only (no pointer); NULL
  // where paged_forward is. Fails only where the size overflows.
  jfa_status (*paged_workspace_bytes)(const jfa::detail::Params& p, size_t* bytes);
};

// Every architecture this build has kernels for.
std::span<const GpuBackend> gpu_backends();

// The backend of the current device; JFA_ERROR_UNSUPPORTED (naming the device's compute
// capability and the ones this build serves) or JFA_ERROR_CUDA otherwise.
jfa_status current_gpu_backend(const GpuBackend** backend);

// Whether some visible device has a backend.
bool gpu_backend_available();

// The workspace sizes a call needs on whichever device it runs: the largest over the backends
// (the size queries name no device).
size_t forward_workspace_bytes(int64_t total_q, int64_t batch);
size_t backward_workspace_bytes(const jfa::detail::BackwardSizes& sizes);
jfa_status paged_workspace_bytes(const jfa::detail::Params& p, size_t* bytes);

}  // namespace jfa::cuda
