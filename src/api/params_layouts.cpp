#include "api/params_layouts.hpp"

#include <cstring>
#include <limits>

#include "common/status.hpp"

namespace jfa::detail {
namespace {

constexpr uint32_t kSize = sizeof(jfa_attention_params);
constexpr uint32_t kSizeV1 = sizeof(AttentionParamsV1);
constexpr uint32_t kBackwardSize = sizeof(jfa_attention_backward_params);
constexpr uint32_t kBackwardSizeV1 = sizeof(AttentionBackwardParamsV1);

// The backward's fields after `forward`, which every layout names alike.
template <typename From, typename To>
void copy_gradient_fields(const From& from, To& to) {
  to.dout = from.dout;
  to.dq = from.dq;
  to.dk = from.dk;
  to.dv = from.dv;
  to.dout_layout = from.dout_layout;
  to.dq_layout = from.dq_layout;
  to.dk_layout = from.dk_layout;
  to.dv_layout = from.dv_layout;
  to.dlse = from.dlse;
  to.deterministic = from.deterministic;
}

jfa_attention_backward_params default_backward_params() {
  jfa_attention_backward_params b{};
  b.struct_size = kBackwardSize;
  b.forward = default_params();
  return b;
}

// The first `size` bytes of the defaults, with struct_size `size`: the forward of every release is
// a prefix of the current one.
void write_forward_defaults(void* dst, uint32_t size) {
  jfa_attention_params d = default_params();
  d.struct_size = size;
  std::memcpy(dst, &d, size);
}

jfa_status bad_forward_size(const char* name, size_t size) {
  return fail(JFA_ERROR_INVALID_ARGUMENT,
              "%s is %zu, not a size of jfa_attention_params this libjfa accepts (%u, or %u as in "
              "jfa.h 0.1.0): fill the struct with jfa_attention_params_init() first (an "
              "uninitialised or zero-filled struct, or one from an unknown version of jfa.h)",
              name, size, static_cast<unsigned>(kSize), static_cast<unsigned>(kSizeV1));
}

}  // namespace

jfa_attention_params default_params() {
  jfa_attention_params p{};
  p.struct_size = kSize;
  p.dtype = JFA_DTYPE_FLOAT16;
  p.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  p.backend = JFA_BACKEND_AUTO;
  p.head_dim_v = 0;  // head_dim
  return p;
}

jfa_status read_params(const jfa_attention_params* in, jfa_attention_params* out) {
  const uint32_t size = in->struct_size;
  if (size != kSize && size != kSizeV1) return bad_forward_size("params->struct_size", size);
  *out = default_params();
  std::memcpy(out, in, size);  // the caller's bytes only
  out->struct_size = kSize;
  return JFA_SUCCESS;
}

jfa_status read_backward_params(const jfa_attention_backward_params* in,
                                jfa_attention_backward_params* out) {
  const uint32_t size = in->struct_size;
  if (size != kBackwardSize && size != kBackwardSizeV1)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "params->struct_size is %u, not a size of jfa_attention_backward_params this "
                "libjfa accepts (%u, or %u as in jfa.h 0.1.0): fill the struct with "
                "jfa_attention_backward_params_init() first",
                static_cast<unsigned>(size), static_cast<unsigned>(kBackwardSize),
                static_cast<unsigned>(kBackwardSizeV1));
  // Each backward layout embeds the forward of its release.
  const uint32_t forward_size = size == kBackwardSize ? kSize : kSizeV1;
  if (in->forward.struct_size != forward_size)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "params->forward.struct_size is %u but a jfa_attention_backward_params of %u bytes "
                "embeds one of %u: fill the struct with jfa_attention_backward_params_init() first",
                static_cast<unsigned>(in->forward.struct_size), static_cast<unsigned>(size),
                static_cast<unsigned>(forward_size));
  *out = default_backward_params();
  if (size == kBackwardSize) {
    *out = *in;
  } else {
    AttentionBackwardParamsV1 old;
    std::memcpy(&old, in, sizeof old);
    copy_gradient_fields(old, *out);
    std::memcpy(&out->forward, &old.forward, sizeof old.forward);
  }
  out->struct_size = kBackwardSize;
  out->forward.struct_size = kSize;
  return JFA_SUCCESS;
}

jfa_status write_default_params(jfa_attention_params* dst, size_t size) {
  if (size != kSize && size != kSizeV1) return bad_forward_size("struct_size", size);
  write_forward_defaults(dst, static_cast<uint32_t>(size));
  return JFA_SUCCESS;
}

jfa_status write_default_backward_params(jfa_attention_backward_params* dst, size_t size) {
  if (size == kBackwardSize) {
    *dst = default_backward_params();
    return JFA_SUCCESS;
  }
  if (size != kBackwardSizeV1)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "struct_size is %zu, not a size of jfa_attention_backward_params this libjfa "
                "accepts (%u, or %u as in jfa.h 0.1.0)",
                size, static_cast<unsigned>(kBackwardSize), static_cast<unsigned>(kBackwardSizeV1));
  AttentionBackwardParamsV1 old{};
  old.struct_size = kBackwardSizeV1;
  write_forward_defaults(&old.forward, kSizeV1);
  copy_gradient_fields(default_backward_params(), old);
  std::memcpy(dst, &old, sizeof old);
  return JFA_SUCCESS;
}

}  // namespace jfa::detail
