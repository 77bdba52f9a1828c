// Work items of the sm90 kernels: one (work-list entry, head) pair, decoded into the sequence
// bounds and the K tiles to visit. Every role decodes an item from the same inputs, so that all
// agree on every skip and on the number of K tiles (and thus on the pipeline phases).
#pragma once

#include <cstdint>

#include "common/tile_visibility.hpp"
#include "cuda/sm90/forward/fwd_args.hpp"
#include "cuda/sm90/shared/work_list.cuh"

namespace jfa::sm90 {

struct WorkItem {
  SeqBounds seq;  // of all sequences of the item
  int32_t first_seq;
  int32_t n_seqs;  // > 1: a shared tile of several short sequences (m_block 0)
  int32_t head;
  int32_t m_block;
  int32_t n_blocks;  // K tiles to visit, 0 when no query row of the tile sees a key
  bool active;       // the tile has query rows
};

// An item of the kernels whose items hold splits of their keys (FwdPagedSplitArgs): its seq's keys
// start key_shift keys into the sequence (where its split's first K tile starts), and n_blocks
// counts the split's K tiles, so that the walk, the mask and the causal diagonal read it as a
// sequence of its own.
struct SplitWorkItem : WorkItem {
  int32_t split;
  int32_t key_shift;
};

// Where an item's keys start in its sequence: 0 but for a split.
__device__ __forceinline__ int32_t key_shift_of(const WorkItem&) { return 0; }
__device__ __forceinline__ int32_t key_shift_of(const SplitWorkItem& w) { return w.key_shift; }

// The K range of an item of one sequence under window `win`: seq's keys start at the tile of the
// first key a row of rows [row0, row_end) sees; the number of K tiles to visit, 0 where no row sees
// a key.
template <int kBlockN>
__host__ __device__ __forceinline__ int32_t local_item_keys(const jfa::detail::Window& win,
                                                            SeqBounds& seq, int64_t row0,
                                                            int64_t row_end) {
  const jfa::detail::Span keys =
      jfa::detail::keys_seen_by_rows(win, row0, row_end, seq.len_q, seq.len_k);
  if (keys.empty()) return 0;
  const int32_t shift = static_cast<int32_t>(keys.begin / kBlockN * kBlockN);
  seq.k_start += shift;
  seq.len_k -= shift;
  return static_cast<int32_t>((keys.end - shift + kBlockN - 1) / kBlockN);
}

// Item `item` of the work list. Items go tile by tile, the heads of one q tile neighbours, except
// (kHeadMajorRuns, no causal mask) inside the run of list entries that holds the q tiles of one
// sequence, whose items go head by head: the CTAs at work then read the K/V of a few heads of one
// sequence, which stay in L2 also for long sequences (with 16 heads of 8K keys, the tile-major
// order streams 64 MB). Under the causal mask the tiles of a head differ in cost and the
// tile-major order keeps the items in flight alike. Dynamic items only: in the round-robin walk of
// three groups every thread decodes, and the extra arithmetic spills.
// kLocal: the local-attention kernels' items (a FwdLocalArgs behind `a`; see local_mask.cuh).
template <int kBlockM, int kBlockN, bool kHeadMajorRuns = false, bool kLocal = false>
__device__ __forceinline__ WorkItem decode_item(const FwdArgs& a, int64_t item) {
  WorkItem w;
  const int64_t tile = item / a.heads_q;
  w.head = static_cast<int32_t>(item - tile * a.heads_q);
  const WorkListEntry e = a.work[tile];
  const EntrySequences es = clamp_entry_sequences(e.seq, e.n_seqs, a.batch);
  w.first_seq = es.first;
  w.n_seqs = es.n;
  w.seq = seq_bounds(a.cu_q, a.cu_k, a.total_q, a.total_k, es.first, es.n);
  w.m_block = w.n_seqs > 1 ? 0 : e.m_block;
  if (kHeadMajorRuns && !a.causal && w.n_seqs == 1) {
    // The run holds m_block = tiles - 1 .. 0 at list entries run_first .. run_first + tiles - 1,
    // so its items are [run_first, run_first + tiles) * heads_q and `item` lies inside.
    const int32_t tiles = q_tile_count<kBlockM>(w.seq.len_q);
    if (e.m_block >= 0 && e.m_block < tiles) {
      const int64_t run_first = tile - (tiles - 1 - e.m_block);
      const int64_t local = item - run_first * a.heads_q;  // in [0, tiles * heads_q)
      const int64_t head = local / tiles;
      w.head = static_cast<int32_t>(head);
      w.m_block = tiles - 1 - static_cast<int32_t>(local - head * tiles);
    }
  }
  w.active = w.m_block >= 0 && static_cast<int64_t>(w.m_block) * kBlockM < w.seq.len_q;
  if constexpr (kLocal) {
    const auto& la = static_cast<const FwdLocalArgs&>(a);
    const int64_t row0 = static_cast<int64_t>(w.m_block) * kBlockM;
    if (!w.active)
      w.n_blocks = 0;
    else if (w.n_seqs > 1)  // every key of the shared tile, each row masked to its own
      w.n_blocks = static_cast<int32_t>((w.seq.len_k + kBlockN - 1) / kBlockN);
    else
      w.n_blocks = local_item_keys<kBlockN>(la.window, w.seq, row0,
                                            min(row0 + kBlockM, static_cast<int64_t>(w.seq.len_q)));
  } else {
    w.n_blocks = tile_k_blocks<kBlockM, kBlockN>(w.seq, w.m_block, a.causal && w.n_seqs == 1);
  }
  return w;
}

// Split `split` of an item's `tiles` K tiles cut in `splits`: [s * per, (s + 1) * per) in key
// order, per = ceil(tiles / splits), clipped to the tiles; none (count 0) where that is past the
// last.
struct TileRun {
  int32_t first, count;
};
__host__ __device__ __forceinline__ TileRun split_tiles(int32_t tiles, int32_t splits,
                                                        int32_t split) {
  const int32_t per = (tiles + splits - 1) / splits;
  const int32_t first = split * per;
  const int32_t count = tiles - first < per ? tiles - first : per;
  return count > 0 ? TileRun{first, count} : TileRun{0, 0};
}

// Item `item` of a kernel whose items hold splits of their keys: split item % splits of the
// (entry, head) item item / splits (decode_item's order, the splits of one neighbours), holding
// split_tiles of its K tiles (an empty split ends with no key, its rows' partials empty).
template <int kBlockM, int kBlockN>
__device__ __forceinline__ SplitWorkItem decode_split_item(const FwdPagedSplitArgs& a,
                                                           int64_t item) {
  const int64_t whole = item / a.splits;
  SplitWorkItem w;
  static_cast<WorkItem&>(w) = decode_item<kBlockM, kBlockN>(a, whole);
  w.split = static_cast<int32_t>(item - whole * a.splits);
  const TileRun run = split_tiles(w.n_blocks, a.splits, w.split);
  w.n_blocks = run.count;
  w.key_shift = run.first * kBlockN;
  w.seq.k_start += w.key_shift;
  w.seq.len_k -= w.key_shift;
  return w;
}

}  // namespace jfa::sm90
