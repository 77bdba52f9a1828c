// The Hopper backward: the forward's support checks plus those of its own tensors, then the
// (dtype, head_dim) instantiation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/status.hpp"
#include "cuda/sm90/backward/bwd_sm90.hpp"
#include "cuda/sm90/backward/bwd_workspace.hpp"
#include "cuda/sm90/host/support.hpp"

namespace jfa::sm90 {

size_t backward_workspace_bytes(int64_t total_q, int64_t total_k, int64_t batch, int32_t heads_q,
                                int32_t head_dim) {
  return backward_workspace_layout(total_q, total_k, batch, heads_q, head_dim).bytes;
}

namespace {

// The instantiation for the call's dtype.
template <int kD, int kRows, int kDv = kD>
[[maybe_unused]] jfa_status backward_in(const jfa::detail::BackwardParams& b,
                                        const jfa::cuda::DeviceFacts& facts) {
  return b.fwd.dtype == JFA_DTYPE_FLOAT16 ? backward_shape<__half, kD, kDv, kRows>(b, facts)
                                          : backward_shape<__nv_bfloat16, kD, kDv, kRows>(b, facts);
}

// At head_dim 32 and 64: steps of two q tiles, unless the sequences are at most one tile long on
// average: then the second tile would be mostly padding. The shapes decide, not the max_seqlen_q
// hint, so that deterministic mode gives the same bits for the same tensors (the two step shapes
// sum in different orders).
template <int kD>
[[maybe_unused]] jfa_status backward_by_rows(const jfa::detail::BackwardParams& b,
                                             const jfa::cuda::DeviceFacts& facts) {
  if (b.fwd.total_q <= kBwdTileRows * b.fwd.batch) return backward_in<kD, kBwdTileRows>(b, facts);
  return backward_in<kD, 2 * kBwdTileRows>(b, facts);
}

}  // namespace

jfa_status backward(const jfa::detail::BackwardParams& b) {
  using jfa::detail::fail;
  const jfa::detail::Params& p = b.fwd;
  const jfa::cuda::DeviceFacts* facts = nullptr;
  if (const jfa_status s = check_supported(p, Pass::kBackward, &facts); s != JFA_SUCCESS) return s;
  const TensorArg tensors[] = {{b.dout, &b.dout_layout, "dout"},
                               {b.dq, &b.dq_layout, "dq"},
                               {b.dk, &b.dk_layout, "dk"},
                               {b.dv, &b.dv_layout, "dv"}};
  if (const jfa_status s = check_tensors_supported(tensors, 4); s != JFA_SUCCESS) return s;
  // The preprocess runs one block row per query head (a grid dimension of at most 65535).
  if (p.heads_q > 65535)
    return fail(JFA_ERROR_UNSUPPORTED, "heads_q %d: the CUDA backward takes at most 65535 heads",
                p.heads_q);
  if (b.dlse != nullptr && (reinterpret_cast<uintptr_t>(b.dlse) & 3u) != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "dlse must be 4-byte aligned");
#ifdef JFA_SM90_BUILT_D32
  if (p.head_dim == 32) return backward_by_rows<32>(b, *facts);
#endif
#ifdef JFA_SM90_BUILT_D64
  if (p.head_dim == 64) return backward_by_rows<64>(b, *facts);
#endif
#ifdef JFA_SM90_BUILT_D96
  if (p.head_dim == 96) return backward_in<96, kBwdTileRows>(b, *facts);
#endif
#ifdef JFA_SM90_BUILT_D128
  if (p.head_dim == 128) return backward_in<128, kBwdTileRows>(b, *facts);
#endif
#ifdef JFA_SM90_BUILT_D192
  if (p.head_dim == 192 && p.head_dim_v == 128)
    return backward_in<192, kBwdTileRows, 128>(b, *facts);
  if (p.head_dim == 192) return backward_in<192, kBwdTileRows>(b, *facts);
#endif
#ifdef JFA_SM90_BUILT_D256
  if (p.head_dim == 256) return backward_in<256, kBwdTileRows>(b, *facts);
#endif
  return fail(JFA_ERROR_INTERNAL, "no backward kernel for head_dim %d", p.head_dim);
}

}  // namespace jfa::sm90
