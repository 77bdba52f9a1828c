// The checked mode for device offsets on the launches that have no list kernel to run the check
// (see check_offsets in work_list.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "common/params.hpp"
#include "cuda/sm90/host/launch_error.hpp"
#include "cuda/sm90/shared/work_list.cuh"

namespace jfa::sm90 {

// Launches the check alone when the call asks for it; JFA_SUCCESS otherwise.
inline jfa_status check_offsets_alone(const jfa::detail::Params& p, cudaStream_t stream) {
  if (p.device_check == nullptr) return JFA_SUCCESS;
  offsets_check_kernel<kListThreads>
      <<<1, kListThreads, 0, stream>>>(p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.total_q,
                                       p.total_k, p.max_seqlen_q, p.max_seqlen_k, p.device_check);
  return launch_error("offsets check");
}

}  // namespace jfa::sm90
