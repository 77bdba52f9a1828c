// Host-side jagged batches for the CLI, the tests and the benchmarks: random Q/K/V in any dtype,
// their offsets, the reference check and the error measure. Not part of the public API.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/float_convert.hpp"
#include "jfa/jfa.hpp"

namespace jfa::tools {

// Bytes of a host tensor of `count` elements of `dtype`.
struct HostBuffer {
  DType dtype = DType::kFloat16;
  std::vector<unsigned char> bytes;

  HostBuffer() = default;
  HostBuffer(DType t, int64_t count)
      : dtype(t), bytes(static_cast<size_t>(count) * dtype_size(t)) {}
  int64_t count() const { return static_cast<int64_t>(bytes.size() / dtype_size(dtype)); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
};

inline void fill_normal(HostBuffer& buffer, std::mt19937_64& rng, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  const auto dtype = static_cast<jfa_dtype>(buffer.dtype);
  for (int64_t i = 0, n = buffer.count(); i < n; ++i)
    detail::store_from_float(buffer.data(), i, dtype, normal(rng));
}

// Writes a NaN pattern (all ones: a NaN in every float format) so unwritten outputs are caught.
inline void poison(HostBuffer& buffer) {
  std::fill(buffer.bytes.begin(), buffer.bytes.end(), 0xFF);
}

inline double element_as_double(const HostBuffer& buffer, int64_t i) {
  return detail::load_as_float(buffer.data(), i, static_cast<jfa_dtype>(buffer.dtype));
}

// A packed jagged attention problem on the host.
struct JaggedBatch {
  std::vector<int32_t> lengths_q, lengths_k;
  std::vector<int32_t> cu_q, cu_k;
  int32_t heads_q = 0, heads_kv = 0, head_dim = 0;
  int32_t head_dim_v = 0;  // columns of v and out; 0 means head_dim
  DType dtype = DType::kFloat16;
  HostBuffer q, k, v;
  // Local attention, softcap and sinks (jfa_attention_params fields of those names); sinks empty:
  // none, else float32 [heads_q].
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  std::vector<float> sinks;

  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
  int64_t batch() const { return static_cast<int64_t>(lengths_q.size()); }
  int32_t value_dim() const { return head_dim_v == 0 ? head_dim : head_dim_v; }

  JaggedTensor q_view() { return {q.data(), dtype, total_q(), heads_q, head_dim, 0, 0}; }
  JaggedTensor k_view() { return {k.data(), dtype, total_k(), heads_kv, head_dim, 0, 0}; }
  JaggedTensor v_view() { return {v.data(), dtype, total_k(), heads_kv, value_dim(), 0, 0}; }
  HostBuffer make_output() const { return HostBuffer(dtype, total_q() * heads_q * value_dim()); }
};

inline JaggedBatch make_batch(std::vector<int32_t> lengths_q, std::vector<int32_t> lengths_k,
                              int32_t heads_q, int32_t heads_kv, int32_t head_dim, DType dtype,
                              uint64_t seed, int32_t head_dim_v = 0) {
  JaggedBatch b;
  b.lengths_q = std::move(lengths_q);
  b.lengths_k = std::move(lengths_k);
  b.cu_q = lengths_to_offsets(b.lengths_q);
  b.cu_k = lengths_to_offsets(b.lengths_k);
  b.heads_q = heads_q;
  b.heads_kv = heads_kv;
  b.head_dim = head_dim;
  b.head_dim_v = head_dim_v;
  b.dtype = dtype;
  std::mt19937_64 rng(seed);
  b.q = HostBuffer(dtype, b.total_q() * heads_q * head_dim);
  b.k = HostBuffer(dtype, b.total_k() * heads_kv * head_dim);
  b.v = HostBuffer(dtype, b.total_k() * heads_kv * b.value_dim());
  fill_normal(b.q, rng);
  fill_normal(b.k, rng);
  fill_normal(b.v, rng);
  return b;
}

// Random sinks, normal(0, stddev) per query head.
inline void draw_sinks(JaggedBatch& batch, uint64_t seed, float stddev = 2.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  batch.sinks.resize(static_cast<size_t>(batch.heads_q));
  for (float& s : batch.sinks) s = normal(rng);
}

// ||out - ref|| / ||ref|| over the listed rows (all rows when `rows` is empty); `ref` holds
// [rows, heads, d] float64. NaN or an infinite value in `out` gives +inf.
inline double relative_error(const HostBuffer& out, const std::vector<double>& ref,
                             const std::vector<int64_t>& rows, int64_t row_elems) {
  double diff = 0, norm = 0;
  const int64_t n_rows = static_cast<int64_t>(ref.size()) / std::max<int64_t>(row_elems, 1);
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t src_row = rows.empty() ? r : rows[static_cast<size_t>(r)];
    for (int64_t e = 0; e < row_elems; ++e) {
      const double o = element_as_double(out, src_row * row_elems + e);
      if (!std::isfinite(o)) return std::numeric_limits<double>::infinity();
      const double x = ref[static_cast<size_t>(r * row_elems + e)];
      diff += (o - x) * (o - x);
      norm += x * x;
    }
  }
  if (norm == 0) return std::sqrt(diff);
  return std::sqrt(diff / norm);
}

// The accepted relative error per dtype against the float64 reference.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kBFloat16:
      return 1e-2;
    default:
      return 2e-3;
  }
}

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    default:
      return "fp16";
  }
}

}  // namespace jfa::tools
