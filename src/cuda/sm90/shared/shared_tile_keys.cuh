// Which keys a query row of a tile shared by several short sequences sees: its own sequence's keys
// (a block-diagonal mask over the tile), and under the causal mask those up to its diagonal,
// bottom-right aligned per sequence. The forward's and the backward's shared tiles both use it.
#pragma once

#include <cstdint>

#include "cuda/sm90/shared/work_list.cuh"

namespace jfa::sm90 {

// Keys [lo, hi) of the tile (relative to tile.k_start) that row `row` of the tile sees; the tile
// holds sequences first_seq .. first_seq + n_seqs - 1 (bounds `tile`, as seq_bounds gives them).
// The row's sequence is found by binary search in cu_q; a row past the tile's last one sees none.
struct KeyRange {
  int32_t lo, hi;
};

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

}  // namespace jfa::sm90
