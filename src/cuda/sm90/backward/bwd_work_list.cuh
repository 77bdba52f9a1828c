// Work of the sm90 backward, built on the device from cu_seqlens (graph-capturable): the list of K
// tiles (one kernel of kListThreads threads, sequences in order, each sequence's K tiles
// ascending, runs of short sequences packed into shared tiles), and the decode of a work item, one
// (K tile, kv head) pair, into the q tiles it walks.
#pragma once

#include <cstdint>

#include "common/tile_visibility.hpp"
#include "cuda/sm90/backward/bwd_args.hpp"
#include "cuda/sm90/shared/sequence_lister.cuh"
#include "cuda/sm90/shared/work_list.cuh"

namespace jfa::sm90 {

// A list entry's sequences (clamp_entry_sequences) and their bounds taken together; a shared
// tile's within kBwdPackRows query rows and one K tile whatever the offsets (only invalid ones
// exceed them), as its steps' per-row key ranges and its one K tile need.
struct BwdEntrySpan {
  EntrySequences seqs;
  SeqBounds bounds;
};

template <int kBlockN = kBwdBlockN>
__host__ __device__ __forceinline__ BwdEntrySpan bwd_entry_span(const int32_t* cu_q,
                                                                const int32_t* cu_k, int64_t batch,
                                                                int64_t total_q, int64_t total_k,
                                                                const BwdListEntry& e) {
  BwdEntrySpan sp;
  sp.seqs = clamp_entry_sequences(e.seq, e.n_seqs, batch);
  sp.bounds = seq_bounds(cu_q, cu_k, total_q, total_k, sp.seqs.first, sp.seqs.n);
  if (sp.seqs.n > 1) {
    sp.bounds.len_q = min(sp.bounds.len_q, kBwdPackRows);
    sp.bounds.len_k = min(sp.bounds.len_k, kBlockN);
  }
  return sp;
}

// Marks tokens [first, first + rows) in the stored rows' bits (bwd_workspace.hpp), a word at a
// time.
__device__ __forceinline__ void mark_stored_rows(uint32_t* bits, int64_t first, int64_t rows) {
  for (int64_t t = first; t < first + rows;) {
    const int64_t word = t >> 5, end = min(first + rows, (word + 1) << 5);
    const int lo = static_cast<int>(t & 31), n = static_cast<int>(end - t);
    atomicOr(bits + word, (n == 32 ? ~0u : ((1u << n) - 1u)) << lo);
    t = end;
  }
}

// Backward entries: a sequence's K tiles of kBlockN keys, ascending, and tiles shared by short
// sequences (at most kBlockN keys and kBwdPackRows query rows) that hold keys (dK and dV are
// written for every key; a run without keys has nothing to do, its rows' dQ stays 0).
template <int kBlockN>
struct BackwardLister {
  __device__ int32_t tiles(int32_t, int32_t len_k) const { return (len_k + kBlockN - 1) / kBlockN; }
  __device__ BwdListEntry tile(int32_t seq, int32_t t, int32_t tiles) const {
    return BwdListEntry{seq, t, tiles, 1};
  }
  __device__ BwdListEntry pack(int32_t seq, int32_t n_seqs) const {
    return BwdListEntry{seq, 0, 1, n_seqs};
  }
  __device__ bool keeps_pack(int32_t, int32_t keys) const { return keys > 0; }
};

// Lists the work of every sequence (list_sequences with BackwardLister); *count gets the number of
// entries (at most `capacity`, which only invalid offsets reach) and *next_item is reset for the
// backward kernel. With `stored_rows` (cleared before), the rows of every shared tile are marked
// there: their dQ is stored into the accumulator, not added. (A template, as every kernel defined
// in a header here.)
template <int kBlockN>
__global__ void __launch_bounds__(kListThreads)
    build_bwd_work_list(const int32_t* cu_q, const int32_t* cu_k, int64_t batch, int64_t total_q,
                        int64_t total_k, BwdListEntry* work, int32_t* count,
                        unsigned long long* next_item, int64_t capacity, int32_t max_q,
                        int32_t max_k, int32_t* device_check, uint32_t* stored_rows) {
  if (device_check != nullptr)
    check_offsets(cu_q, cu_k, batch, total_q, total_k, max_q, max_k, device_check);
  static_assert(kBlockN == 64 || kBlockN == kBwdBlockN, "K tiles of 64 or 128 keys");
  __shared__ int64_t scratch[32];
  const int64_t running = list_sequences<kBwdPackRows, kBlockN>(
      BackwardLister<kBlockN>{}, cu_q, cu_k, batch, total_q, total_k, work, capacity, scratch);
  const int64_t n = running < capacity ? running : capacity;
  if (stored_rows != nullptr) {
    __syncthreads();  // every entry written
    for (int64_t i = threadIdx.x; i < n; i += kListThreads) {
      const BwdEntrySpan sp = bwd_entry_span<kBlockN>(cu_q, cu_k, batch, total_q, total_k, work[i]);
      // As the item walks them: none without keys (only invalid offsets give such a tile).
      if (sp.seqs.n > 1 && sp.bounds.len_k > 0)
        mark_stored_rows(stored_rows, sp.bounds.q_start, sp.bounds.len_q);
    }
  }
  if (threadIdx.x == 0) {
    *count = static_cast<int32_t>(n);
    *next_item = 0;
  }
}

// One work item: the K tile n_block (kBlockN keys) of one kv head of one sequence, with the
// steps [m_first, m_end) (kBlockM query rows each) of each of the group's query heads that see any
// of its keys; or (n_seqs > 1) the keys of the short sequences first_seq .. first_seq + n_seqs - 1
// together (`seq` their bounds, n_block 0), whose steps walk all their rows. With head splits
// (BwdConfig::kHeadSplits) kv_head numbers the (kv head, slice) pairs and the steps are those of
// the slice's query heads (item_kv_head, item_first_q_head, item_heads).
struct BwdItem {
  SeqBounds seq;
  int32_t first_seq;
  int32_t n_seqs;
  int32_t kv_head;
  int32_t n_block;
  int32_t m_first, m_end;
  int32_t sem_tile;  // first_sem_tile of the sequence
  int32_t valid;     // 0 ends the walk

  __host__ __device__ __forceinline__ int32_t q_tiles() const { return m_end - m_first; }
};

// An item's kv head, its first query head and its number of query heads: the group's, or with head
// splits (kHeadSplits) one slice of group / head_splits of them.
template <bool kHeadSplits>
__host__ __device__ __forceinline__ int32_t item_kv_head(const BwdArgs& a, const BwdItem& w) {
  return kHeadSplits ? w.kv_head / a.head_splits : w.kv_head;
}
template <bool kHeadSplits>
__host__ __device__ __forceinline__ int32_t item_heads(const BwdArgs& a) {
  return kHeadSplits ? a.item_heads : a.group;
}
template <bool kHeadSplits>
__host__ __device__ __forceinline__ int32_t item_first_q_head(const BwdArgs& a, const BwdItem& w) {
  return w.kv_head * item_heads<kHeadSplits>(a);
}

// Whether deterministic mode walks each item's q tiles up from its first and adds a q tile's dQ
// parts in descending K-tile order (the K tiles of a head claimed last to first): where rows see no
// key past a bound to the right of their diagonal (the causal mask, or a window's right side), so
// that a K tile further right reaches a q tile first. Otherwise the walk goes down from the last q
// tile and the adds ascend. kLocal: the local-attention kernels' BwdLocalArgs behind `a`.
template <bool kLocal>
__host__ __device__ __forceinline__ bool adds_descend(const BwdArgs& a) {
  if constexpr (kLocal)
    return static_cast<const BwdLocalArgs&>(a).window.right >= 0;
  else
    return a.causal != 0;
}

// Item `item` of the list: the items of one sequence's run of entries go head by head (all K tiles
// of one kv head, or of one slice of its query heads with head splits, then the next), so the CTAs
// at work on a sequence stream the same Q and dO through L2, and the K tiles of one head are
// claimed in ascending order, descending in deterministic mode under the causal mask or a window's
// right bound (adds_descend; the order of dQ's adds, dq_add_rank, relies on it). Under a window an
// item walks only the q tiles whose rows see its keys.
template <int kBlockM, int kBlockN = kBwdBlockN, bool kLocal = false, bool kHeadSplits = false>
__host__ __device__ __forceinline__ BwdItem decode_bwd_item(const BwdArgs& a, int64_t item) {
  BwdItem w{};
  // kv heads, or (kv head, slice) pairs
  const int64_t item_heads_kv = kHeadSplits ? int64_t{a.heads_kv} * a.head_splits : a.heads_kv;
  const int64_t slot = item / item_heads_kv;
  const BwdListEntry e = a.work[slot];
  const BwdEntrySpan sp = bwd_entry_span<kBlockN>(a.cu_q, a.cu_k, a.batch, a.total_q, a.total_k, e);
  const int32_t b = sp.seqs.first;
  w.first_seq = sp.seqs.first;
  w.n_seqs = sp.seqs.n;
  w.seq = sp.bounds;
  const int32_t tiles = (w.seq.len_k + kBlockN - 1) / kBlockN;
  w.kv_head = static_cast<int32_t>(item - slot * item_heads_kv);
  w.n_block = e.n_block;
  if (e.n_block >= 0 && e.n_block < tiles && e.n_tiles == tiles) {
    // The run holds n_block = 0 .. tiles - 1 at entries run_first .. run_first + tiles - 1.
    const int64_t run_first = slot - e.n_block;
    const int64_t local = item - run_first * item_heads_kv;  // in [0, tiles * item_heads_kv)
    w.kv_head = static_cast<int32_t>(local / tiles);
    w.n_block = static_cast<int32_t>(local - static_cast<int64_t>(w.kv_head) * tiles);
    // Deterministic, adds descending: a head's K tiles are claimed last to first (dq_add_rank).
    if (a.deterministic && adds_descend<kLocal>(a)) w.n_block = tiles - 1 - w.n_block;
  }
  w.valid = 1;
  w.m_end = (w.seq.len_q + kBlockM - 1) / kBlockM;
  w.m_first = 0;
  if (w.n_block < 0 || w.n_block >= tiles) {
    w.m_first = w.m_end;  // only invalid offsets get here: nothing to walk
  } else if (kLocal && w.n_seqs == 1) {
    // The q tiles of the rows that see some key of the tile.
    const int64_t key0 = static_cast<int64_t>(w.n_block) * kBlockN;
    const jfa::detail::Span rows = jfa::detail::rows_seeing_keys(
        static_cast<const BwdLocalArgs&>(a).window, key0, key0 + kBlockN, w.seq.len_q, w.seq.len_k);
    if (rows.empty()) {
      w.m_first = w.m_end;
    } else {
      w.m_first = static_cast<int32_t>(rows.begin / kBlockM);
      w.m_end = static_cast<int32_t>((rows.end + kBlockM - 1) / kBlockM);
    }
  } else if (a.causal && w.n_seqs == 1) {
    // The first row that sees the tile's first key.
    const int64_t first_row = static_cast<int64_t>(w.n_block) * kBlockN - w.seq.causal_shift();
    if (first_row >= w.seq.len_q)
      w.m_first = w.m_end;
    else if (first_row > 0)
      w.m_first = static_cast<int32_t>(first_row / kBlockM);
  }
  w.sem_tile = static_cast<int32_t>(first_sem_tile(w.seq.q_start, b));
  return w;
}

// The rows (in kBlockM units) of step i of an item's walk over one query head's rows: from the last
// ones down (the K tiles of a head then reach the last q tiles together, which concurrent CTAs
// share in L2), or, in deterministic mode with adds descending (the causal mask, a window's right
// bound), from the item's first q tile up (see dq_add_rank).
template <bool kLocal = false>
__host__ __device__ __forceinline__ int32_t walk_q_tile(const BwdArgs& a, const BwdItem& w,
                                                        int32_t i) {
  return a.deterministic && adds_descend<kLocal>(a) ? w.m_first + i : w.m_end - 1 - i;
}

// Deterministic mode: how many K tiles add to q tile m (kBwdTileRows rows of the item's sequence)
// before K tile w.n_block does. Without the causal mask every K tile adds to every q tile, in
// ascending order: they reach each q tile at the same step, and the ones claimed first add first.
// Under it the K tiles that see q tile m are 0 .. n_last(m), walking up from their diagonals
// (walk_q_tile), so K tile n + 1 reaches q tile m steps before K tile n (kBlockN rows later: with
// 128 keys two steps of 64 rows or one of 128, with 64 keys one step); they add in descending
// order, and with a head's K tiles claimed last to first (decode_bwd_item) each add waits only for
// items claimed before it, whose adds are due earlier. (Walking down and adding in ascending order,
// all K tiles reached a q tile together, and K tile n's add waited for a chain of n others. That
// chain is left for the K tiles that every query row sees, len_k - len_q >= kBlockN: they all start
// at the first rows.)
//
// Under a window (kLocal) the K tiles that add to q tile m are those holding the keys its rows see,
// n_first(m) .. n_last(m) (one interval, tile_visibility.hpp): rank n_last(m) - n with adds
// descending, n - n_first(m) otherwise; -1 where q tile m sees no key of K tile n.
template <int kBlockN = kBwdBlockN, bool kLocal = false>
__host__ __device__ __forceinline__ int32_t dq_add_rank(const BwdArgs& a, const BwdItem& w,
                                                        int32_t m) {
  if constexpr (kLocal) {
    const jfa::detail::Span keys = jfa::detail::keys_seen_by_rows(
        static_cast<const BwdLocalArgs&>(a).window, int64_t{m} * kBwdTileRows,
        (int64_t{m} + 1) * kBwdTileRows, w.seq.len_q, w.seq.len_k);
    if (keys.empty()) return -1;
    const int64_t n_first = keys.begin / kBlockN, n_last = (keys.end - 1) / kBlockN;
    if (w.n_block < n_first || w.n_block > n_last) return -1;
    return static_cast<int32_t>(adds_descend<true>(a) ? n_last - w.n_block : w.n_block - n_first);
  }
  if (!a.causal) return w.n_block;
  const int64_t last_row = min(w.seq.len_q, (m + 1) * kBwdTileRows) - 1;
  const int64_t last_key = last_row + w.seq.causal_shift();
  if (last_key < 0) return -1;  // the q tile sees no key (a two-tile step's first tile)
  const int32_t tiles = (w.seq.len_k + kBlockN - 1) / kBlockN;
  const int64_t n_last = last_key / kBlockN < tiles - 1 ? last_key / kBlockN : tiles - 1;
  return static_cast<int32_t>(n_last - w.n_block);
}

// Which q tile a consumer group's dQ part of step m adds to, how many of its rows hold queries,
// and its rank in the q tile's deterministic order (dq_add_rank, which is needed in deterministic
// mode and, for two-tile steps, under the causal mask or a window). With two q tiles per step
// (kRowsPerStep = 2 kBwdTileRows) each group takes one; a q tile past the sequence's end, or whose
// rows see no key of the item (causal: above every key; a window: either side), adds no rows.
// (tests/cuda_host/backward_order_test.cu checks this choice.)
struct DqAdd {
  int32_t q_tile, rows, rank;
};

template <int kRowsPerStep, int kBlockN = kBwdBlockN, bool kLocal = false>
__host__ __device__ __forceinline__ DqAdd dq_add_of_step(const BwdArgs& a, const BwdItem& w,
                                                         int32_t m, int group) {
  constexpr bool kTwoTiles = kRowsPerStep == 2 * kBwdTileRows;
  const int32_t q_tile = m * (kRowsPerStep / kBwdTileRows) + (kTwoTiles ? group : 0);
  int32_t rows = max(0, min(kBwdTileRows, w.seq.len_q - q_tile * kBwdTileRows));
  // A shared tile's rows get dQ from that item alone: no order to keep.
  const bool ranked = w.n_seqs == 1 && (a.deterministic || (kTwoTiles && (kLocal || a.causal)));
  const int32_t rank = ranked ? dq_add_rank<kBlockN, kLocal>(a, w, q_tile) : 0;
  if (kTwoTiles && rank < 0) rows = 0;
  return DqAdd{q_tile, rows, rank};
}

}  // namespace jfa::sm90
