// The status of a kernel launch just made: success, or JFA_ERROR_CUDA naming what was launched.
#pragma once

#include <cuda_runtime_api.h>

#include "common/status.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

inline jfa_status launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return JFA_SUCCESS;
  return jfa::detail::fail(JFA_ERROR_CUDA, "%s launch failed: %s", what, cudaGetErrorString(e));
}

}  // namespace jfa::sm90
