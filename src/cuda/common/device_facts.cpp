#include "cuda/common/device_facts.hpp"

#include <atomic>
#include <mutex>

namespace jfa::cuda {
namespace {

constexpr int kMaxDevices = 64;

DeviceFacts query(int device) {
  DeviceFacts f;
  f.ordinal = device;
  f.error = cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device);
  if (f.error == cudaSuccess)
    f.error = cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, device);
  if (f.error == cudaSuccess)
    f.error = cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device);
  if (f.error != cudaSuccess) cudaGetLastError();
  return f;
}

}  // namespace

const DeviceFacts& device_facts(int device) {
  static DeviceFacts kept[kMaxDevices];
  static std::atomic<bool> ready[kMaxDevices];
  static std::mutex mu;
  thread_local DeviceFacts uncached;
  if (device < 0 || device >= kMaxDevices) {
    uncached = query(device);
    return uncached;
  }
  if (ready[device].load(std::memory_order_acquire)) return kept[device];
  std::lock_guard<std::mutex> lock(mu);
  if (ready[device].load(std::memory_order_relaxed)) return kept[device];
  const DeviceFacts f = query(device);
  if (f.error != cudaSuccess) {
    uncached = f;
    return uncached;
  }
  kept[device] = f;
  ready[device].store(true, std::memory_order_release);
  return kept[device];
}

}  // namespace jfa::cuda
