// What the launch path needs to know of a CUDA device, queried once per device and kept: a call
// makes no device-attribute queries after the first on that device.
#pragma once

#include <cuda_runtime_api.h>

namespace jfa::cuda {

struct DeviceFacts {
  cudaError_t error = cudaSuccess;  // of the queries; the other fields are valid when cudaSuccess
  int ordinal = -1;                 // the device's index
  int major = 0;                    // compute capability
  int minor = 0;
  int sm_count = 0;
};

// The facts of `device`. A failed query is not kept (the next call asks again).
const DeviceFacts& device_facts(int device);

}  // namespace jfa::cuda
