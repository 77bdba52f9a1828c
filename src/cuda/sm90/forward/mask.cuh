// Which keys each query row sees: the keys of its own sequence, and under the causal mask those up
// to its diagonal (bottom-right aligned when query and key lengths differ). One sequence per item
// gives every row the same range up to the diagonal; a shared tile of short sequences gives each
// row its own sequence's keys (a block-diagonal mask). Masked scores become -inf before the
// softmax; K tiles that no row needs masked skip the check.
#pragma once

#include <cstdint>

#include "cuda/sm90/forward/work_items.cuh"
#include "cuda/sm90/shared/shared_tile_keys.cuh"
#include "cuda/tlx/fragment.hpp"

namespace jfa::sm90 {

// Keys [lo, hi) of the item's K range that each of a thread's two rows may see.
struct RowKeys {
  int32_t lo[2], hi[2];
};

// The ranges of the rows row0 and row0 + 8 of the item (see AccumFragment::row); a shared tile's
// rows from shared_tile_row_keys.
__device__ __forceinline__ RowKeys row_key_ranges(const FwdArgs& a, const WorkItem& w,
                                                  int32_t row0) {
  RowKeys rk;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t row = row0 + 8 * h;
    int32_t lo = 0, hi = w.seq.len_k;
    if (w.n_seqs == 1) {
      if (a.causal) {
        const int64_t last = static_cast<int64_t>(row) + w.seq.causal_shift() + 1;
        hi = last < 0 ? 0 : (last < hi ? static_cast<int32_t>(last) : hi);
      }
    } else {
      const KeyRange r = shared_tile_row_keys(a.cu_q, a.cu_k, a.total_q, w.seq, w.first_seq,
                                              w.n_seqs, a.causal != 0, row);
      lo = r.lo;
      hi = r.hi;
    }
    rk.lo[h] = lo;
    rk.hi[h] = hi;
  }
  return rk;
}

// The mask of one item as a consumer thread of group `group` applies it.
struct ItemMask {
  int32_t row0;        // the first of the thread's two rows, within the item
  int32_t first_row;   // of the tile
  int32_t diag_shift;  // len_k - len_q
  int32_t key_end;     // no row of this warp group sees a key at or past this one
  bool causal;
  bool shared;   // several sequences in the tile: always mask
  RowKeys keys;  // filled by load_keys

  template <int kBlockM, int kCols>
  __device__ __forceinline__ static ItemMask of(const FwdArgs& a, const WorkItem& w, int group) {
    ItemMask m;
    m.first_row = w.m_block * kBlockM;
    m.row0 = m.first_row + group * 64 + tlx::AccumFragment<kCols>::row(0);
    m.diag_shift = w.seq.causal_shift();
    m.causal = a.causal != 0;
    m.shared = w.n_seqs > 1;
    // Warp-group uniform: the group's rows start at group_first; under the causal mask its last
    // row sees keys up to its diagonal.
    const int64_t group_first = static_cast<int64_t>(m.first_row) + group * 64;
    int64_t key_end = w.seq.len_k;
    if (group_first >= w.seq.len_q)
      key_end = 0;
    else if (m.causal && !m.shared)
      key_end = group_first + 64 + m.diag_shift;
    m.key_end =
        static_cast<int32_t>(key_end < 0 ? 0 : (key_end < w.seq.len_k ? key_end : w.seq.len_k));
    return m;
  }

  __device__ __forceinline__ void load_keys(const FwdArgs& a, const WorkItem& w) {
    keys = row_key_ranges(a, w, row0);
  }

  // A K tile needs the mask when it reaches past the key range's end or (causal) past the diagonal
  // of the tile's first row.
  __device__ __forceinline__ bool needs_mask(int32_t key0, int32_t block_n, int32_t len_k) const {
    return shared || key0 + block_n > len_k ||
           (causal && key0 + block_n - 1 > first_row + diag_shift);
  }

  // Scores of keys outside each row's range become -inf; the tile starts at key key0.
  template <int kCols>
  __device__ __forceinline__ void apply(tlx::AccumFragment<kCols>& s, int32_t key0) const {
    s.for_each([&](float& x, int h, int col) {
      const int32_t key = key0 + col;
      if (key < keys.lo[h] || key >= keys.hi[h]) x = -INFINITY;
    });
  }
};

}  // namespace jfa::sm90
