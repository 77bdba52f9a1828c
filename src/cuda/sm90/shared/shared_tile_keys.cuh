// Which keys a query row of a tile shared by several short sequences sees: its own sequence's keys
// (a block-diagonal mask over the tile), and under the causal mask or a window those that rule
// gives, bottom-right aligned per sequence. The forward's and the backward's shared tiles use it.
#pragma once

#include <cstdint>

#include "common/visibility.hpp"
#include "cuda/sm90/shared/work_list.cuh"

namespace jfa::sm90 {

struct KeyRange {
  int32_t lo, hi;
};

// The sequence of row `row` of a tile that holds sequences first_seq .. first_seq + n_seqs - 1
// (bounds `tile`, as seq_bounds gives them), found by binary search in cu_q: its keys [lo, hi)
// relative to tile.k_start, the row's index in it and its query length; a row past the tile's last
// one has no keys.
struct RowSequence {
  KeyRange keys;
  int32_t row;
  int32_t len_q;
};

__device__ __forceinline__ RowSequence
shared_tile_row_sequence(const int32_t* cu_q, const int32_t* cu_k, int64_t total_q,
                         const SeqBounds& tile, int32_t first_seq, int32_t n_seqs, int32_t row) {
  if (row < 0 || row >= tile.len_q) return RowSequence{{0, 0}, 0, 0};
  const int32_t token = tile.q_start + row;
  const int32_t seq =
      sequence_holding_token<int32_t>(cu_q, first_seq, first_seq + n_seqs - 1, total_q, token);
  const int32_t qs = clamp_offset(__ldg(cu_q + seq), 0, total_q);
  const int32_t qe = clamp_offset(__ldg(cu_q + seq + 1), qs, total_q);
  const int64_t k_end = static_cast<int64_t>(tile.k_start) + tile.len_k;
  const int32_t ks = clamp_offset(__ldg(cu_k + seq), tile.k_start, k_end);
  const int32_t ke = clamp_offset(__ldg(cu_k + seq + 1), ks, k_end);
  return RowSequence{{ks - tile.k_start, ke - tile.k_start}, token - qs, qe - qs};
}

// Keys [lo, hi) of the tile that row `row` of the tile sees: its sequence's, under the causal mask
// those up to its diagonal; a row past the tile's last one sees none. (The lookup written out as
// shared_tile_row_sequence's: the plain kernels keep the code they were measured with.)
__device__ __forceinline__ KeyRange shared_tile_row_keys(const int32_t* cu_q, const int32_t* cu_k,
                                                         int64_t total_q, const SeqBounds& tile,
                                                         int32_t first_seq, int32_t n_seqs,
                                                         bool causal, int32_t row) {
  if (row < 0 || row >= tile.len_q) return KeyRange{0, 0};
  const int32_t token = tile.q_start + row;
  const int32_t first =
      sequence_holding_token<int32_t>(cu_q, first_seq, first_seq + n_seqs - 1, total_q, token);
  const int32_t qs = clamp_offset(__ldg(cu_q + first), 0, total_q);
  const int32_t qe = clamp_offset(__ldg(cu_q + first + 1), qs, total_q);
  const int64_t k_end = static_cast<int64_t>(tile.k_start) + tile.len_k;
  const int32_t ks = clamp_offset(__ldg(cu_k + first), tile.k_start, k_end);
  const int32_t ke = clamp_offset(__ldg(cu_k + first + 1), ks, k_end);
  KeyRange r{ks - tile.k_start, ke - tile.k_start};
  if (causal) {
    const int64_t last_key = static_cast<int64_t>(r.lo) + (token - qs) + (ke - ks) - (qe - qs) + 1;
    r.hi = last_key < r.lo ? r.lo : (last_key < r.hi ? static_cast<int32_t>(last_key) : r.hi);
  }
  return r;
}

// The same under a window (common/visibility.hpp), for the local-attention kernels.
__device__ __forceinline__ KeyRange shared_tile_row_keys(const int32_t* cu_q, const int32_t* cu_k,
                                                         int64_t total_q, const SeqBounds& tile,
                                                         int32_t first_seq, int32_t n_seqs,
                                                         const jfa::detail::Window& window,
                                                         int32_t row) {
  const RowSequence rs =
      shared_tile_row_sequence(cu_q, cu_k, total_q, tile, first_seq, n_seqs, row);
  const int32_t n = rs.keys.hi - rs.keys.lo;
  return KeyRange{
      rs.keys.lo +
          static_cast<int32_t>(jfa::detail::first_visible_key(window, rs.row, rs.len_q, n)),
      rs.keys.lo + static_cast<int32_t>(jfa::detail::key_end(window, rs.row, rs.len_q, n))};
}

}  // namespace jfa::sm90
