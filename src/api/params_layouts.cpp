#include "api/params_layouts.hpp"

#include <cstring>
#include <limits>

#include "common/status.hpp"

namespace jfa::detail {
namespace {

constexpr uint32_t kSize = sizeof(jfa_attention_params);
constexpr uint32_t kSizeV1 = sizeof(AttentionParamsV1);
constexpr uint32_t kSizeV2 = sizeof(AttentionParamsV2);
constexpr uint32_t kBackwardSize = sizeof(jfa_attention_backward_params);
constexpr uint32_t kBackwardSizeV1 = sizeof(AttentionBackwardParamsV1);
constexpr uint32_t kBackwardSizeV2 = sizeof(AttentionBackwardParamsV2);

bool accepted_forward_size(size_t size) {
  return size == kSize || size == kSizeV1 || size == kSizeV2;
}

// The bytes of a forward layout of `size` (an accepted size) that hold its fields.
size_t field_bytes(uint32_t size) {
  return size == kSizeV1 ? kFieldBytesV1 : size == kSizeV2 ? kFieldBytesV2 : size;
}

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
  b.dsinks = nullptr;
  return b;
}

// The field bytes of the defaults in the layout of `size`, with struct_size `size` (the forward of
// every release is a prefix of the current one); the tail padding of an earlier layout is zeroed.
void write_forward_defaults(void* dst, uint32_t size) {
  jfa_attention_params d = default_params();
  d.struct_size = size;
  const size_t fields = field_bytes(size);
  std::memcpy(dst, &d, fields);
  std::memset(static_cast<char*>(dst) + fields, 0, size - fields);
}

jfa_status bad_forward_size(const char* name, size_t size) {
  return fail(JFA_ERROR_INVALID_ARGUMENT,
              "%s is %zu, not a size of jfa_attention_params this libjfa accepts (%u; %u with "
              "head_dim_v as its last field; or %u as in jfa.h 0.1.0): fill the struct with "
              "jfa_attention_params_init() first (an uninitialised or zero-filled struct, or one "
              "from an unknown version of jfa.h)",
              name, size, static_cast<unsigned>(kSize), static_cast<unsigned>(kSizeV2),
              static_cast<unsigned>(kSizeV1));
}

jfa_status bad_backward_size(const char* name, size_t size, const char* hint) {
  return fail(JFA_ERROR_INVALID_ARGUMENT,
              "%s is %zu, not a size of jfa_attention_backward_params this libjfa accepts (%u; %u "
              "with a forward whose last field is head_dim_v; or %u as in jfa.h 0.1.0)%s",
              name, size, static_cast<unsigned>(kBackwardSize),
              static_cast<unsigned>(kBackwardSizeV2), static_cast<unsigned>(kBackwardSizeV1), hint);
}

// An earlier backward layout Old, whose forward holds `forward_fields` bytes of fields, read into
// the current one (`out` holds the defaults).
template <typename Old>
void read_old_backward(const jfa_attention_backward_params* in, size_t forward_fields,
                       jfa_attention_backward_params* out) {
  Old old;
  std::memcpy(&old, in, sizeof old);
  copy_gradient_fields(old, *out);
  std::memcpy(&out->forward, &old.forward, forward_fields);
}

template <typename Old>
void write_old_backward(jfa_attention_backward_params* dst, uint32_t size, uint32_t forward_size) {
  Old old;
  std::memset(&old, 0, sizeof old);
  old.struct_size = size;
  write_forward_defaults(&old.forward, forward_size);
  copy_gradient_fields(default_backward_params(), old);
  std::memcpy(dst, &old, sizeof old);
}

}  // namespace

jfa_attention_params default_params() {
  jfa_attention_params p{};
  p.struct_size = kSize;
  p.dtype = JFA_DTYPE_FLOAT16;
  p.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  p.backend = JFA_BACKEND_AUTO;
  p.head_dim_v = 0;    // head_dim
  p.window_left = -1;  // unbounded
  p.window_right = -1;
  p.softcap = 0.0f;  // off
  p.sinks = nullptr;
  return p;
}

jfa_status read_params(const jfa_attention_params* in, jfa_attention_params* out) {
  const uint32_t size = in->struct_size;
  if (!accepted_forward_size(size)) return bad_forward_size("params->struct_size", size);
  *out = default_params();
  std::memcpy(out, in, field_bytes(size));  // the caller's fields only
  out->struct_size = kSize;
  return JFA_SUCCESS;
}

jfa_status read_backward_params(const jfa_attention_backward_params* in,
                                jfa_attention_backward_params* out) {
  const uint32_t size = in->struct_size;
  if (size != kBackwardSize && size != kBackwardSizeV2 && size != kBackwardSizeV1)
    return bad_backward_size("params->struct_size", size,
                             ": fill the struct with jfa_attention_backward_params_init() first");
  // Each backward layout embeds the forward of its release.
  const uint32_t forward_size = size == kBackwardSize     ? kSize
                                : size == kBackwardSizeV2 ? kSizeV2
                                                          : kSizeV1;
  if (in->forward.struct_size != forward_size)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "params->forward.struct_size is %u but a jfa_attention_backward_params of %u bytes "
                "embeds one of %u: fill the struct with jfa_attention_backward_params_init() first",
                static_cast<unsigned>(in->forward.struct_size), static_cast<unsigned>(size),
                static_cast<unsigned>(forward_size));
  *out = default_backward_params();
  if (size == kBackwardSize)
    *out = *in;
  else if (size == kBackwardSizeV2)
    read_old_backward<AttentionBackwardParamsV2>(in, kFieldBytesV2, out);
  else
    read_old_backward<AttentionBackwardParamsV1>(in, kFieldBytesV1, out);
  out->struct_size = kBackwardSize;
  out->forward.struct_size = kSize;
  return JFA_SUCCESS;
}

jfa_status write_default_params(jfa_attention_params* dst, size_t size) {
  if (!accepted_forward_size(size)) return bad_forward_size("struct_size", size);
  write_forward_defaults(dst, static_cast<uint32_t>(size));
  return JFA_SUCCESS;
}

jfa_status write_default_backward_params(jfa_attention_backward_params* dst, size_t size) {
  if (size == kBackwardSize) {
    *dst = default_backward_params();
  } else if (size == kBackwardSizeV2) {
    write_old_backward<AttentionBackwardParamsV2>(dst, kBackwardSizeV2, kSizeV2);
  } else if (size == kBackwardSizeV1) {
    write_old_backward<AttentionBackwardParamsV1>(dst, kBackwardSizeV1, kSizeV1);
  } else {
    return bad_backward_size("struct_size", size, "");
  }
  return JFA_SUCCESS;
}

}  // namespace jfa::detail
