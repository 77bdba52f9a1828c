// jfa_workspace: device scratch memory kept across calls, grown to the largest size asked for.
#include <cstddef>
#include <new>

#include "api/enum_bits.hpp"
#include "api/error.hpp"
#include "api/memory_probe.hpp"
#include "api/params_layouts.hpp"
#include "jfa/jfa.h"
#ifdef JFA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

using jfa::detail::fail;
using jfa::detail::guarded;

struct jfa_workspace {
  void* memory = nullptr;
  size_t bytes = 0;
  int device = -1;
};

namespace {

// Points *memory / *bytes at the workspace's memory for a call that needs `needed` bytes, growing
// it on the current device first; a host-memory call (probe in host memory, or the CPU backend)
// gets none.
jfa_status point_at_workspace(jfa_workspace* workspace, size_t needed, const void* probe,
                              const jfa_backend& backend, void** memory, size_t* bytes) {
  *memory = nullptr;
  *bytes = 0;
  if (jfa::detail::enum_bits(backend) == JFA_BACKEND_CPU ||
      jfa::detail::memory_kind(probe) == jfa::detail::MemoryKind::kHost)
    return JFA_SUCCESS;
#ifdef JFA_WITH_CUDA
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(JFA_ERROR_CUDA, "cudaGetDevice failed: %s", cudaGetErrorString(e));
  }
  if (workspace->memory != nullptr && workspace->device != device)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "workspace holds memory of device %d but the current device is %d; keep one "
                "workspace per device",
                workspace->device, device);
  if (needed > workspace->bytes) {
    if (workspace->memory != nullptr) {
      e = cudaFree(workspace->memory);  // waits for the calls that still use it
      workspace->memory = nullptr;
      workspace->bytes = 0;
      if (e != cudaSuccess) {
        cudaGetLastError();
        return fail(JFA_ERROR_CUDA, "cudaFree of the workspace failed: %s", cudaGetErrorString(e));
      }
    }
    e = cudaMalloc(&workspace->memory, needed);
    if (e != cudaSuccess) {
      cudaGetLastError();
      workspace->memory = nullptr;
      return fail(e == cudaErrorMemoryAllocation ? JFA_ERROR_OUT_OF_MEMORY : JFA_ERROR_CUDA,
                  "cudaMalloc of a %zu-byte workspace failed: %s", needed, cudaGetErrorString(e));
    }
    workspace->bytes = needed;
    workspace->device = device;
  }
  *memory = workspace->memory;
  *bytes = workspace->bytes;
#else
  (void)workspace;
  (void)needed;
#endif
  return JFA_SUCCESS;
}

}  // namespace

extern "C" {

jfa_status jfa_workspace_create(jfa_workspace** workspace) {
  return guarded([&] {
    if (workspace == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "workspace must not be NULL");
    *workspace = new (std::nothrow) jfa_workspace{};
    if (*workspace == nullptr)
      return fail(JFA_ERROR_OUT_OF_MEMORY, "cannot allocate a jfa_workspace handle");
    return JFA_SUCCESS;
  });
}

jfa_status jfa_workspace_destroy(jfa_workspace* workspace) {
  return guarded([&] {
    if (workspace == nullptr) return JFA_SUCCESS;
#ifdef JFA_WITH_CUDA
    if (workspace->memory != nullptr) {
      const cudaError_t e = cudaFree(workspace->memory);
      if (e != cudaSuccess) cudaGetLastError();
    }
#endif
    delete workspace;
    return JFA_SUCCESS;
  });
}

jfa_status jfa_workspace_prepare(jfa_workspace* workspace, jfa_attention_params* params) {
  return guarded([&] {
    if (workspace == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "workspace must not be NULL");
    if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
    size_t needed = 0;  // also checks struct_size
    if (const jfa_status s = jfa_attention_workspace_size(params, &needed); s != JFA_SUCCESS)
      return s;
    jfa_attention_params p;  // read in the current layout; workspace lies alike in every one
    if (const jfa_status s = jfa::detail::read_params(params, &p); s != JFA_SUCCESS) return s;
    return point_at_workspace(workspace, needed, p.q != nullptr ? p.q : p.out, p.backend,
                              &params->workspace, &params->workspace_bytes);
  });
}

jfa_status jfa_workspace_prepare_paged(jfa_workspace* workspace, jfa_attention_params* params,
                                       const jfa_paged_kv* kv) {
  return guarded([&] {
    if (workspace == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "workspace must not be NULL");
    if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
    size_t needed = 0;  // also checks struct_size and kv
    if (const jfa_status s = jfa_attention_paged_workspace_size(params, kv, &needed);
        s != JFA_SUCCESS)
      return s;
    jfa_attention_params p;  // read in the current layout; workspace lies alike in every one
    if (const jfa_status s = jfa::detail::read_params(params, &p); s != JFA_SUCCESS) return s;
    const void* probe = p.q != nullptr ? p.q : kv->k_cache;
    return point_at_workspace(workspace, needed, probe, p.backend, &params->workspace,
                              &params->workspace_bytes);
  });
}

jfa_status jfa_workspace_prepare_backward(jfa_workspace* workspace,
                                          jfa_attention_backward_params* params) {
  return guarded([&] {
    if (workspace == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "workspace must not be NULL");
    if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
    size_t needed = 0;  // also checks both struct sizes
    if (const jfa_status s = jfa_attention_backward_workspace_size(params, &needed);
        s != JFA_SUCCESS)
      return s;
    // Read in the current layout (dq lies elsewhere in the 0.1.0 one); forward.workspace and
    // workspace_bytes lie alike in every layout (params_layouts.hpp).
    jfa_attention_backward_params b;
    if (const jfa_status s = jfa::detail::read_backward_params(params, &b); s != JFA_SUCCESS)
      return s;
    const jfa_attention_params& f = b.forward;
    return point_at_workspace(workspace, needed, f.q != nullptr ? f.q : b.dq, f.backend,
                              &params->forward.workspace, &params->forward.workspace_bytes);
  });
}

}  // extern "C"
