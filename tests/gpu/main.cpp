// GPU test driver: exits with 77 (reported as skipped by ctest) when no Hopper GPU is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("no GPU present (%s): skipping the GPU tests\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return 77;
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) {
    std::printf("GPU 0 has compute capability %d.%d; these tests need 9.0 (Hopper): skipping\n",
                major, minor);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
