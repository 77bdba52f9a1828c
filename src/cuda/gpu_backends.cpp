#include "cuda/gpu_backends.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/backward/bwd_sm90.hpp"
#include "cuda/sm90/forward/fwd_sm90.hpp"
#include "cuda/sm90/forward/workspace.hpp"
#include "cuda/sm90/paged/paged_sm90.hpp"

namespace jfa::cuda {
namespace {

size_t sm90_forward_workspace_bytes(int64_t total_q, int64_t batch) {
  return jfa::sm90::forward_workspace_bytes(total_q, batch);
}

constexpr GpuBackend kBackends[] = {
    {"sm90", 9, 0, &jfa::sm90::forward, &jfa::sm90::backward, &sm90_forward_workspace_bytes,
     &jfa::sm90::backward_workspace_bytes, &jfa::sm90::paged_forward,
     &jfa::sm90::paged_forward_workspace_bytes},
};

const GpuBackend* backend_for(const DeviceFacts& facts) {
  for (const GpuBackend& b : kBackends)
    if (b.major == facts.major && b.minor == facts.minor) return &b;
  return nullptr;
}

std::string served_capabilities() {
  std::string s;
  for (const GpuBackend& b : kBackends) {
    if (!s.empty()) s += ", ";
    s += std::to_string(b.major) + "." + std::to_string(b.minor) + " (" + b.name + ")";
  }
  return s;
}

}  // namespace

std::span<const GpuBackend> gpu_backends() { return kBackends; }

jfa_status current_gpu_backend(const GpuBackend** backend) {
  using jfa::detail::fail;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    cudaGetLastError();
    return fail(JFA_ERROR_CUDA, "cannot query the current CUDA device: %s", cudaGetErrorString(e));
  }
  const DeviceFacts& facts = device_facts(device);
  if (facts.error != cudaSuccess)
    return fail(JFA_ERROR_CUDA, "cannot query CUDA device %d: %s", device,
                cudaGetErrorString(facts.error));
  *backend = backend_for(facts);
  if (*backend == nullptr)
    return fail(JFA_ERROR_UNSUPPORTED,
                "device %d has compute capability %d.%d; the CUDA kernels of this build run on "
                "compute capability %s",
                device, facts.major, facts.minor, served_capabilities().c_str());
  return JFA_SUCCESS;
}

bool gpu_backend_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    cudaGetLastError();
    return false;
  }
  for (int d = 0; d < count; ++d) {
    const DeviceFacts& facts = device_facts(d);
    if (facts.error == cudaSuccess && backend_for(facts) != nullptr) return true;
  }
  return false;
}

size_t forward_workspace_bytes(int64_t total_q, int64_t batch) {
  size_t bytes = 0;
  for (const GpuBackend& b : kBackends)
    bytes = std::max(bytes, b.forward_workspace_bytes(total_q, batch));
  return bytes;
}

size_t backward_workspace_bytes(const jfa::detail::BackwardSizes& sizes) {
  size_t bytes = 0;
  for (const GpuBackend& b : kBackends) bytes = std::max(bytes, b.backward_workspace_bytes(sizes));
  return bytes;
}

jfa_status paged_workspace_bytes(const jfa::detail::Params& p, size_t* bytes) {
  *bytes = 0;
  for (const GpuBackend& b : kBackends) {
    if (b.paged_workspace_bytes == nullptr) continue;
    size_t one = 0;
    if (const jfa_status s = b.paged_workspace_bytes(p, &one); s != JFA_SUCCESS) return s;
    *bytes = std::max(*bytes, one);
  }
  return JFA_SUCCESS;
}

}  // namespace jfa::cuda
