// The mask of the local-attention kernels (WithLocalAttention in choices.hpp): which keys each
// query row sees under a sliding window, by the one rule of common/visibility.hpp and its block
// forms (common/tile_visibility.hpp), as the CPU backend and the references apply it.
//
// An item of one sequence visits only the K tiles that some row of its Q tile sees: its key range
// is shifted to start at the tile holding the first such key (local_item_keys). The rule depends
// on a row's diagonal i + len_k - len_q alone, so the shifted keys (len_k less the shift) keep
// every row's window; keys below the shift are seen by no row of the item. Shared tiles of short
// sequences keep all their keys and mask each row within its own sequence.
#pragma once

#include <cstdint>

#include "common/tile_visibility.hpp"
#include "common/visibility.hpp"
#include "cuda/sm90/forward/fwd_args.hpp"
#include "cuda/sm90/forward/mask.cuh"
#include "cuda/sm90/shared/shared_tile_keys.cuh"

namespace jfa::sm90 {

// ItemMask's interface under a window: the same row ranges and the same apply, other bounds.
struct LocalItemMask : ItemMask {
  jfa::detail::Window window;
  int32_t len_q, len_k;  // of the item (len_k shifted, see local_item_keys)
  int32_t block_m;

  template <int kBlockM, int kCols>
  __device__ __forceinline__ static LocalItemMask of(const FwdArgs& a, const WorkItem& w,
                                                     int group) {
    const auto& la = static_cast<const FwdLocalArgs&>(a);
    LocalItemMask m;
    m.window = la.window;
    m.len_q = w.seq.len_q;
    m.len_k = w.seq.len_k;
    m.block_m = kBlockM;
    m.first_row = w.m_block * kBlockM;
    m.row0 = m.first_row + group * 64 + tlx::AccumFragment<kCols>::row(0);
    m.diag_shift = w.seq.causal_shift();
    m.causal = false;  // the window holds it
    m.shared = w.n_seqs > 1;
    // Warp-group uniform: no row of the group sees a key at or past key_end.
    const int64_t group_first = static_cast<int64_t>(m.first_row) + group * 64;
    int64_t key_end = m.shared ? w.seq.len_k : 0;
    if (group_first >= w.seq.len_q)
      key_end = 0;
    else if (!m.shared)
      key_end = jfa::detail::keys_seen_by_rows(m.window, group_first, group_first + 64, w.seq.len_q,
                                               w.seq.len_k)
                    .end;
    m.key_end = static_cast<int32_t>(key_end);
    return m;
  }

  __device__ __forceinline__ void load_keys(const FwdArgs& a, const WorkItem& w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = row0 + 8 * h;
      if (!shared) {
        keys.lo[h] =
            static_cast<int32_t>(jfa::detail::first_visible_key(window, row, len_q, len_k));
        keys.hi[h] = static_cast<int32_t>(jfa::detail::key_end(window, row, len_q, len_k));
      } else {
        const KeyRange r = shared_tile_row_keys(a.cu_q, a.cu_k, a.total_q, w.seq, w.first_seq,
                                                w.n_seqs, window, row);
        keys.lo[h] = r.lo;
        keys.hi[h] = r.hi;
      }
    }
  }

  // A K tile needs the mask unless every row of the item's tile sees every key of it.
  __device__ __forceinline__ bool needs_mask(int32_t key0, int32_t block_n,
                                             int32_t /*len_k*/) const {
    return shared || !jfa::detail::block_fully_visible(window, first_row, first_row + block_m, key0,
                                                       key0 + block_n, len_q, len_k);
  }
};

}  // namespace jfa::sm90
