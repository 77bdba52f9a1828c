// Helpers shared by the GPU tests: CUDA checks, seeds, device buffers, switches.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#define JFA_CUDA_OK(expr)                                                          \
  do {                                                                             \
    const cudaError_t jfa_e_ = (expr);                                             \
    ASSERT_EQ(jfa_e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(jfa_e_); \
  } while (0)

namespace jfa::gpu_test {

// A fresh seed per call unless JFA_TEST_SEED is set; printed so a failure can be replayed.
inline uint64_t fresh_seed(const char* what) {
  static std::random_device rd;
  uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  if (const char* env = std::getenv("JFA_TEST_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::printf("[seed] %s: %llu\n", what, static_cast<unsigned long long>(seed));
  return seed;
}

// Reduced case set (for the sanitizers): JFA_GPU_TESTS_QUICK=1.
// The local-attention cases of the forward's and the backward's tests: windows at their edges (0,
// 1, one side only, both sides, longer than any sequence, with the causal mask), softcap small
// enough to bend unit-normal scores, sinks small and large, and all together.
struct LocalKind {
  int32_t left, right;
  bool causal;
  float softcap, sink_sd;  // sink_sd > 0: sinks ~ N(0, sink_sd)
};
inline constexpr LocalKind kLocalKinds[] = {
    {0, 0, false, 0.f, 0.f},    {1, -1, false, 0.f, 0.f},      {-1, 1, false, 0.f, 0.f},
    {64, 0, true, 0.f, 0.f},    {5, 17, false, 0.f, 0.f},      {300, -1, true, 0.f, 0.f},
    {130, 70, false, 0.f, 0.f}, {4096, 4096, false, 0.f, 0.f}, {-1, -1, false, 0.5f, 0.f},
    {-1, -1, true, 0.f, 2.f},   {-1, -1, false, 0.f, 30.f},    {130, 0, true, 0.5f, 2.f}};

inline bool quick_mode() {
  const char* env = std::getenv("JFA_GPU_TESTS_QUICK");
  return env != nullptr && env[0] != '\0' && env[0] != '0';
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n > 0 && cudaMalloc(&ptr, n) != cudaSuccess) {
      ptr = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << n << " bytes failed";
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr) cudaFree(ptr);
      ptr = o.ptr;
      bytes = o.bytes;
      o.ptr = nullptr;
    }
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// The checked mode's word after `call(word)`: set first to a value no check stores, so that a
// stale word cannot pass, and read back once the device is done.
template <typename Call>
int32_t device_check_after(const DeviceBuffer& word, Call&& call) {
  EXPECT_EQ(cudaMemset(word.ptr, 0x7F, sizeof(int32_t)), cudaSuccess);
  call(word.as<int32_t>());
  int32_t got = -1;
  EXPECT_EQ(cudaMemcpy(&got, word.ptr, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
  return got;
}

// Bytes the default memory pool of the current device has handed out at its peak since the last
// reset (the library's per-call allocation comes from it).
inline size_t default_pool_peak(bool reset) {
  int device = 0;
  cudaMemPool_t pool;
  cudaGetDevice(&device);
  cudaDeviceGetDefaultMemPool(&pool, device);
  uint64_t value = 0;  // the attribute is a 64-bit unsigned integer
  if (reset) cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &value);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &value);
  return static_cast<size_t>(value);
}

// Sets an environment variable for a scope (the library reads its switches per call).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace jfa::gpu_test
