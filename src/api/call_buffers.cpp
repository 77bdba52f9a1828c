#include "api/call_buffers.hpp"

#include "jfa/jfa.h"

namespace jfa::detail {
namespace {

// A [total, heads, d] tensor of the call in its dtype: d is head_dim (q, k and their gradients) or
// head_dim_v (v, out and theirs).
BufferView tensor_view(const char* name, const void* base, int64_t total, int32_t heads, int32_t d,
                       const Params& p, const Layout& layout, bool written) {
  return {name, base, total, heads, d, layout, jfa_dtype_size(p.dtype), written};
}

// The caller's workspace (if any): the CUDA path writes all of it.
BufferView workspace_view(const Params& p) {
  return array_view("workspace", p.workspace,
                    p.workspace != nullptr ? static_cast<int64_t>(p.workspace_bytes) : 0, 1, true);
}

}  // namespace

BufferView array_view(const char* name, const void* base, int64_t n, size_t element_bytes,
                      bool written) {
  return {name, base, n, 1, 1, {1, 1}, element_bytes, written};
}

BufferView packed_view(const char* name, const void* base, int64_t total, int32_t heads, int32_t d,
                       size_t element_bytes, bool written) {
  return {name,          base,   total, heads, d, {static_cast<int64_t>(heads) * d, d},
          element_bytes, written};
}

std::vector<BufferView> forward_buffers(const Params& p) {
  return {tensor_view("out", p.out, p.total_q, p.heads_q, p.head_dim_v, p, p.out_layout, true),
          array_view("lse", p.lse, p.total_q * p.heads_q, sizeof(float), true),
          tensor_view("q", p.q, p.total_q, p.heads_q, p.head_dim, p, p.q_layout, false),
          tensor_view("k", p.k, p.total_k, p.heads_kv, p.head_dim, p, p.k_layout, false),
          tensor_view("v", p.v, p.total_k, p.heads_kv, p.head_dim_v, p, p.v_layout, false),
          array_view("cu_seqlens_q", p.cu_seqlens_q, p.batch + 1, sizeof(int32_t), false),
          array_view("cu_seqlens_k", p.cu_seqlens_k, p.batch + 1, sizeof(int32_t), false),
          array_view("sinks", p.sinks, p.heads_q, sizeof(float), false),
          workspace_view(p),
          array_view("device_check", p.device_check, 1, sizeof(int32_t), true)};
}

std::vector<BufferView> backward_buffers(const BackwardParams& b) {
  const Params& p = b.fwd;
  std::vector<BufferView> v = {
      tensor_view("dq", b.dq, p.total_q, p.heads_q, p.head_dim, p, b.dq_layout, true),
      tensor_view("dk", b.dk, p.total_k, p.heads_kv, p.head_dim, p, b.dk_layout, true),
      tensor_view("dv", b.dv, p.total_k, p.heads_kv, p.head_dim_v, p, b.dv_layout, true),
      tensor_view("dout", b.dout, p.total_q, p.heads_q, p.head_dim_v, p, b.dout_layout, false),
      array_view("dlse", b.dlse, p.total_q * p.heads_q, sizeof(float), false),
      array_view("dsinks", b.dsinks, p.heads_q, sizeof(float), true)};
  for (BufferView f : forward_buffers(p)) {
    // The forward's outputs are inputs now; the workspace and the offsets check are written.
    f.written = f.base != nullptr && (f.base == p.workspace || f.base == p.device_check);
    v.push_back(f);
  }
  return v;
}

}  // namespace jfa::detail
