#include "cli/padded.hpp"

#include <vector>

namespace jfa::cli {
namespace {

tools::HostBuffer pad(const tools::HostBuffer& jagged, const std::vector<int32_t>& offsets,
                      int64_t row_elems, int32_t max_len) {
  const int64_t batch = static_cast<int64_t>(offsets.size()) - 1;
  tools::HostBuffer padded(jagged.dtype, batch * max_len * row_elems);
  if (padded.count() > 0) {
    jagged_to_padded(jagged.data(), offsets, row_elems, jagged.dtype, max_len, 0.0, padded.data());
  }
  return padded;
}

}  // namespace

tools::JaggedBatch make_padded(const tools::JaggedBatch& jagged) {
  tools::JaggedBatch p;
  const int32_t max_q = max_length(jagged.cu_q);
  const int32_t max_k = max_length(jagged.cu_k);
  p.lengths_q.assign(jagged.lengths_q.size(), max_q);
  p.lengths_k.assign(jagged.lengths_k.size(), max_k);
  p.cu_q = lengths_to_offsets(p.lengths_q);
  p.cu_k = lengths_to_offsets(p.lengths_k);
  p.heads_q = jagged.heads_q;
  p.heads_kv = jagged.heads_kv;
  p.head_dim = jagged.head_dim;
  p.head_dim_v = jagged.head_dim_v;
  p.dtype = jagged.dtype;
  p.window_left = jagged.window_left;
  p.window_right = jagged.window_right;
  p.softcap = jagged.softcap;
  p.sinks = jagged.sinks;
  const int64_t q_row = static_cast<int64_t>(jagged.heads_q) * jagged.head_dim;
  const int64_t k_row = static_cast<int64_t>(jagged.heads_kv) * jagged.head_dim;
  const int64_t v_row = static_cast<int64_t>(jagged.heads_kv) * jagged.value_dim();
  p.q = pad(jagged.q, jagged.cu_q, q_row, max_q);
  p.k = pad(jagged.k, jagged.cu_k, k_row, max_k);
  p.v = pad(jagged.v, jagged.cu_k, v_row, max_k);
  return p;
}

}  // namespace jfa::cli
