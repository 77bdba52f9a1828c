// Support checks of the Hopper forward and dispatch to the (dtype, head_dim) instantiations.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.hpp"
#include "cuda/sm90/choices.hpp"
#include "cuda/sm90/device_facts.hpp"
#include "cuda/sm90/fwd_sm90.hpp"
#ifdef JFA_SM90_TUNING
#include "cuda/sm90/tuning_switch.hpp"
#endif

namespace jfa::sm90 {
namespace {

constexpr const char* kSupported =
    "the CUDA backend supports fp16 and bf16, head_dim 64 or 128, softmax_scale > 0, q/k/v/out "
    "16-byte aligned with token and head strides that are multiples of 8 elements, on compute "
    "capability 9.0 (Hopper) GPUs";

// Consumer groups at head_dim 64 and keys per K tile at 128, from the mean query length
// (choices.hpp); a tuning build lets JFA_SM90_D64_ROWS=128|192 and JFA_SM90_D128_KEYS=128|160 force
// a shape.
int groups_at_head_dim_64(const jfa::detail::Params& p) {
  const int groups = jfa::sm90::head_dim_64_groups(p.total_q, p.batch);
#ifdef JFA_SM90_TUNING
  return tuning_switch(TuningSwitch::kD64Rows, 64 * groups) / 64;
#else
  return groups;
#endif
}

int keys_at_head_dim_128(const jfa::detail::Params& p) {
  const int keys = jfa::sm90::head_dim_128_keys(p.total_q, p.batch, p.causal);
#ifdef JFA_SM90_TUNING
  return tuning_switch(TuningSwitch::kD128Keys, keys);
#else
  return keys;
#endif
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
bool stride_ok(const jfa::detail::Layout& l) {
  return l.token_stride % 8 == 0 && l.head_stride % 8 == 0;
}

}  // namespace

bool hopper_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    cudaGetLastError();
    return false;
  }
  for (int d = 0; d < count; ++d) {
    const DeviceFacts& facts = device_facts(d);
    if (facts.error == cudaSuccess && facts.major == 9 && facts.minor == 0) return true;
  }
  return false;
}

jfa_status forward(const jfa::detail::Params& p) {
  using jfa::detail::fail;
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(JFA_ERROR_CUDA, "cannot query the current CUDA device: %s", cudaGetErrorString(e));
  }
  const DeviceFacts& facts = device_facts(device);
  if (facts.error != cudaSuccess)
    return fail(JFA_ERROR_CUDA, "cannot query CUDA device %d: %s", device,
                cudaGetErrorString(facts.error));
  if (facts.major != 9 || facts.minor != 0)
    return fail(JFA_ERROR_UNSUPPORTED, "device %d has compute capability %d.%d; %s", device,
                facts.major, facts.minor, kSupported);
  if (p.dtype != JFA_DTYPE_FLOAT16 && p.dtype != JFA_DTYPE_BFLOAT16)
    return fail(JFA_ERROR_UNSUPPORTED, "dtype float32 is not supported on CUDA; %s", kSupported);
  if (p.head_dim != 64 && p.head_dim != 128)
    return fail(JFA_ERROR_UNSUPPORTED, "head_dim %d is not built; %s", p.head_dim, kSupported);
  if (!(p.softmax_scale > 0.f))
    return fail(JFA_ERROR_UNSUPPORTED, "softmax_scale %g is not supported; %s",
                static_cast<double>(p.softmax_scale), kSupported);
  struct Named {
    const void* ptr;
    const jfa::detail::Layout* layout;
    const char* name;
  };
  const Named tensors[] = {{p.q, &p.q_layout, "q"},
                           {p.k, &p.k_layout, "k"},
                           {p.v, &p.v_layout, "v"},
                           {p.out, &p.out_layout, "out"}};
  for (const Named& t : tensors) {
    if (t.ptr != nullptr && !aligned16(t.ptr))
      return fail(JFA_ERROR_UNSUPPORTED, "%s is not 16-byte aligned; %s", t.name, kSupported);
    if (!stride_ok(*t.layout))
      return fail(
          JFA_ERROR_UNSUPPORTED,
          "%s strides (token_stride=%lld, head_stride=%lld) are not multiples of 8 elements; %s",
          t.name, static_cast<long long>(t.layout->token_stride),
          static_cast<long long>(t.layout->head_stride), kSupported);
  }
  if (p.lse != nullptr && (reinterpret_cast<uintptr_t>(p.lse) & 3u) != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "lse must be 4-byte aligned");
  const bool half = p.dtype == JFA_DTYPE_FLOAT16;
  if (p.head_dim == 64) {
    if (groups_at_head_dim_64(p) == 2)
      return half ? forward_shape<__half, 64, 2, 128>(p, facts)
                  : forward_shape<__nv_bfloat16, 64, 2, 128>(p, facts);
    return half ? forward_shape<__half, 64, 3, 128>(p, facts)
                : forward_shape<__nv_bfloat16, 64, 3, 128>(p, facts);
  }
  if (keys_at_head_dim_128(p) == 160)
    return half ? forward_shape<__half, 128, 2, 160>(p, facts)
                : forward_shape<__nv_bfloat16, 128, 2, 160>(p, facts);
  return half ? forward_shape<__half, 128, 2, 128>(p, facts)
              : forward_shape<__nv_bfloat16, 128, 2, 128>(p, facts);
}

}  // namespace jfa::sm90
