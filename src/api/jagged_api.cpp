// C entry points of the jagged utilities.
#include <algorithm>
#include <limits>
#include <vector>

#include "api/buffer_checks.hpp"
#include "api/call_buffers.hpp"
#include "api/enum_bits.hpp"
#include "api/error.hpp"
#include "api/overlap.hpp"
#include "api/validate.hpp"
#include "cpu/jagged_ops.hpp"

using jfa::detail::array_view;
using jfa::detail::BufferView;
using jfa::detail::fail;
using jfa::detail::guarded;

namespace {

jfa_status check_dtype(const jfa_dtype& dtype) {
  const int32_t bits = jfa::detail::enum_bits(dtype);
  if (bits != JFA_DTYPE_FLOAT16 && bits != JFA_DTYPE_BFLOAT16 && bits != JFA_DTYPE_FLOAT32)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "dtype %d is not a jfa_dtype", bits);
  return JFA_SUCCESS;
}

// Shared checks of the two copy directions: jagged [offsets[batch], row_elems] and padded
// [batch, max_length, row_elems], the destination written.
jfa_status check_copy(const void* jagged, const void* padded, bool to_padded,
                      const int32_t* offsets, int64_t batch, int64_t row_elems,
                      const jfa_dtype& dtype, int32_t max_length) {
  jfa_status s;
  if ((s = check_dtype(dtype)) != JFA_SUCCESS) return s;
  if (row_elems < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "row_elems must be >= 0, got %lld",
                static_cast<long long>(row_elems));
  if (max_length < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "max_length must be >= 0, got %d", max_length);
  if ((s = jfa::detail::validate_offsets_named(offsets, batch, -1, "offsets")) != JFA_SUCCESS)
    return s;
  const __int128 padded_elems = static_cast<__int128>(batch) * max_length * row_elems;
  if (padded_elems * 4 > std::numeric_limits<int64_t>::max())
    return fail(JFA_ERROR_INVALID_ARGUMENT, "batch * max_length * row_elems overflows");
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t len = offsets[b + 1] - offsets[b];
    if (len > max_length)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "sequence %lld has length %d > max_length %d",
                  static_cast<long long>(b), len, max_length);
  }
  const bool empty = offsets[batch] == 0 && (batch == 0 || max_length == 0);
  if (!empty && row_elems > 0) {
    if (jagged == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "jagged must not be NULL");
    if (padded == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "padded must not be NULL");
  }
  // Every sequence fits in max_length, so the jagged rows are no more than the padded ones.
  const size_t esize = jfa_dtype_size(dtype);
  const std::vector<BufferView> buffers = {
      array_view("jagged", jagged, static_cast<int64_t>(offsets[batch]) * row_elems, esize,
                 !to_padded),
      array_view("padded", padded, static_cast<int64_t>(padded_elems), esize, to_padded),
      array_view("offsets", offsets, batch + 1, sizeof(int32_t), false)};
  if ((s = jfa::detail::check_aligned(buffers)) != JFA_SUCCESS) return s;
  return jfa::detail::check_outputs_disjoint(buffers);
}

}  // namespace

extern "C" {

size_t jfa_dtype_size(jfa_dtype dtype) {
  switch (jfa::detail::enum_bits(dtype)) {
    case JFA_DTYPE_FLOAT16:
    case JFA_DTYPE_BFLOAT16:
      return 2;
    case JFA_DTYPE_FLOAT32:
      return 4;
    default:
      return 0;  // not a jfa_dtype
  }
}

jfa_status jfa_lengths_to_offsets(const int32_t* lengths, int64_t batch, int32_t* offsets) {
  return guarded([&] {
    if (batch < 0)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "batch must be >= 0, got %lld",
                  static_cast<long long>(batch));
    if (offsets == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "offsets must not be NULL");
    if (batch > 0 && lengths == nullptr)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "lengths must not be NULL when batch > 0");
    jfa_status s;
    const std::vector<BufferView> buffers = {
        array_view("offsets", offsets, batch + 1, sizeof(int32_t), true),
        array_view("lengths", lengths, batch, sizeof(int32_t), false)};
    if ((s = jfa::detail::check_aligned(buffers)) != JFA_SUCCESS) return s;
    // In place (offsets == lengths, one element longer) works: each length is read before its
    // slot is overwritten. Any other overlap would read lengths already overwritten.
    if (offsets != lengths && (s = jfa::detail::check_outputs_disjoint(buffers)) != JFA_SUCCESS)
      return s;
    int64_t total = 0;
    for (int64_t b = 0; b < batch; ++b) {
      if (lengths[b] < 0)
        return fail(JFA_ERROR_INVALID_ARGUMENT, "lengths[%lld]=%d must be >= 0",
                    static_cast<long long>(b), lengths[b]);
      total += lengths[b];
      if (total > std::numeric_limits<int32_t>::max())
        return fail(JFA_ERROR_INVALID_ARGUMENT,
                    "the sum of lengths overflows int32 at lengths[%lld]",
                    static_cast<long long>(b));
    }
    int32_t sum = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t length = lengths[b];
      offsets[b] = sum;
      sum += length;
    }
    offsets[batch] = sum;
    return JFA_SUCCESS;
  });
}

jfa_status jfa_validate_offsets(const int32_t* offsets, int64_t batch, int64_t total) {
  return guarded(
      [&] { return jfa::detail::validate_offsets_named(offsets, batch, total, "offsets"); });
}

jfa_status jfa_max_length(const int32_t* offsets, int64_t batch, int32_t* max_length) {
  return guarded([&] {
    if (max_length == nullptr)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "max_length must not be NULL");
    if (const jfa_status s = jfa::detail::check_aligned("max_length", max_length, sizeof(int32_t));
        s != JFA_SUCCESS)
      return s;
    jfa_status s = jfa::detail::validate_offsets_named(offsets, batch, -1, "offsets");
    if (s != JFA_SUCCESS) return s;
    int32_t m = 0;
    for (int64_t b = 0; b < batch; ++b) m = std::max(m, offsets[b + 1] - offsets[b]);
    *max_length = m;
    return JFA_SUCCESS;
  });
}

jfa_status jfa_jagged_to_padded(const void* jagged, const int32_t* offsets, int64_t batch,
                                int64_t row_elems, jfa_dtype dtype, int32_t max_length,
                                double padding_value, void* padded) {
  return guarded([&] {
    jfa_status s = check_copy(jagged, padded, /*to_padded=*/true, offsets, batch, row_elems, dtype,
                              max_length);
    if (s != JFA_SUCCESS) return s;
    jfa::detail::jagged_to_padded_cpu(jagged, offsets, batch, row_elems, dtype, max_length,
                                      padding_value, padded);
    return JFA_SUCCESS;
  });
}

jfa_status jfa_padded_to_jagged(const void* padded, const int32_t* offsets, int64_t batch,
                                int64_t row_elems, jfa_dtype dtype, int32_t max_length,
                                void* jagged) {
  return guarded([&] {
    jfa_status s = check_copy(jagged, padded, /*to_padded=*/false, offsets, batch, row_elems, dtype,
                              max_length);
    if (s != JFA_SUCCESS) return s;
    jfa::detail::padded_to_jagged_cpu(padded, offsets, batch, row_elems, dtype, max_length, jagged);
    return JFA_SUCCESS;
  });
}

}  // extern "C"
