#include "cpu/jagged_ops.hpp"

#include <cstring>

#include "common/float_convert.hpp"

namespace jfa::detail {

void jagged_to_padded_cpu(const void* jagged, const int32_t* offsets, int64_t batch,
                          int64_t row_elems, jfa_dtype dtype, int32_t max_length,
                          double padding_value, void* padded) {
  const size_t esize = jfa_dtype_size(dtype);
  const size_t row_bytes = static_cast<size_t>(row_elems) * esize;
  // One padding row, encoded once in the target dtype.
  char pad[4];
  store_from_float(pad, 0, dtype, static_cast<float>(padding_value));
  const auto* src = static_cast<const char*>(jagged);
  auto* dst = static_cast<char*>(padded);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = offsets[b + 1] - offsets[b];
    char* seq = dst + static_cast<size_t>(b) * max_length * row_bytes;
    if (row_bytes > 0 && len > 0)
      std::memcpy(seq, src + static_cast<size_t>(offsets[b]) * row_bytes, len * row_bytes);
    const size_t pad_elems = static_cast<size_t>(max_length - len) * row_elems;
    char* fill = seq + len * row_bytes;
    for (size_t e = 0; e < pad_elems; ++e) std::memcpy(fill + e * esize, pad, esize);
  }
}

void padded_to_jagged_cpu(const void* padded, const int32_t* offsets, int64_t batch,
                          int64_t row_elems, jfa_dtype dtype, int32_t max_length, void* jagged) {
  const size_t row_bytes = static_cast<size_t>(row_elems) * jfa_dtype_size(dtype);
  const auto* src = static_cast<const char*>(padded);
  auto* dst = static_cast<char*>(jagged);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = offsets[b + 1] - offsets[b];
    if (row_bytes > 0 && len > 0)
      std::memcpy(dst + static_cast<size_t>(offsets[b]) * row_bytes,
                  src + static_cast<size_t>(b) * max_length * row_bytes, len * row_bytes);
  }
}

}  // namespace jfa::detail
