// Layout of the backward's device workspace (see jfa_attention_backward_workspace_size): a header
// (the work list's entry count and the item counter), the work list (one entry per K tile), the
// per-row softmax terms of the preprocess (LSE in base 2 and D = rowsum(dO * O) - dLSE, each
// [heads_q, row_len], the D rows right after the LSE rows) in a layout padded per sequence to
// whole q tiles, one semaphore per q tile and head (deterministic mode), and the float32
// accumulator of dQ.
#pragma once

#include <cstddef>
#include <cstdint>

// The layout is plain C++ too (the host's size query and its tests include it without CUDA).
#ifdef __CUDACC__
#define JFA_HOST_DEVICE __host__ __device__
#else
#define JFA_HOST_DEVICE
#endif

namespace jfa::sm90 {

// Query rows of a q tile: the unit of the per-row arrays' padding, of the deterministic
// semaphores and of a dQ reduction (a step of the kernel takes one or two q tiles).
inline constexpr int kBwdTileRows = 64;
inline constexpr int kBwdBlockN = 128;  // keys per backward work item (two consumer groups of 64)

// The float32 dQ accumulator, total_q x heads_q x head_dim floats (no padding), laid out so that
// the rows of one q tile and 64 columns of one head are contiguous: parts of 64 columns, part
// (head, col / 64) holding every token's 64 floats in token order, the 16-byte chunks of token t's
// row permuted by 2 (t % 4). A thread of the MMA fragment stages two adjacent chunks' halves of one
// row; with that permutation the four rows of a half warp (whose 8-byte stores go together) fall
// on different banks. A q tile's rows of a part are what one bulk reduction adds.
inline constexpr int kDqPartCols = 64;
JFA_HOST_DEVICE constexpr int64_t dq_part_base(int64_t total_q, int64_t head_dim, int64_t head,
                                               int64_t part) {
  return (head * (head_dim / kDqPartCols) + part) * total_q * kDqPartCols;
}
JFA_HOST_DEVICE constexpr int dq_chunk_offset(int64_t token, int col) {  // col in [0, 64)
  return (((col >> 2) ^ (static_cast<int>(token & 3) << 1)) << 2) + (col & 3);
}
JFA_HOST_DEVICE constexpr int64_t dq_acc_offset(int64_t total_q, int64_t head_dim, int64_t token,
                                                int64_t head, int col) {  // col in [0, head_dim)
  return dq_part_base(total_q, head_dim, head, col / kDqPartCols) + token * kDqPartCols +
         dq_chunk_offset(token, col % kDqPartCols);
}

// One entry of the backward's work list: K tile n_block of sequence `seq`, which has n_tiles K
// tiles; the tiles of one sequence are consecutive entries, n_block ascending.
struct BwdListEntry {
  int32_t seq;
  int32_t n_block;
  int32_t n_tiles;
};

// First row of sequence b in the padded per-row arrays: a multiple of kBwdTileRows, with room for
// the whole q tiles of every sequence before it (from its first token q_start).
JFA_HOST_DEVICE constexpr int64_t padded_row(int64_t q_start, int64_t b) {
  return (q_start + b * kBwdTileRows) / kBwdTileRows * kBwdTileRows;
}

struct BwdWorkspaceLayout {
  int64_t list_capacity;  // entries: sum over sequences of ceil(len_k / kBwdBlockN)
  int64_t row_len;        // padded rows per head of the per-row arrays
  size_t list, lse2, dpsum, sems, dq_acc, bytes;         // byte offsets, and the total
  size_t zeroed_bytes() const { return dq_acc - sems; }  // the semaphores, cleared per call
};

constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

constexpr BwdWorkspaceLayout backward_workspace_layout(int64_t total_q, int64_t total_k,
                                                       int64_t batch, int64_t heads_q,
                                                       int64_t head_dim) {
  BwdWorkspaceLayout w{};
  w.list_capacity = (total_k + kBwdBlockN - 1) / kBwdBlockN + batch;
  w.row_len = static_cast<int64_t>(
      align_up(static_cast<size_t>(total_q + kBwdTileRows * batch), kBwdTileRows));
  constexpr size_t kAlign = 256;
  w.list = 16;
  w.lse2 = align_up(w.list + sizeof(BwdListEntry) * static_cast<size_t>(w.list_capacity), kAlign);
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(heads_q * w.row_len);
  w.dpsum = w.lse2 + row_bytes;  // right after the LSE rows: one tensor map covers both
  w.sems = align_up(w.dpsum + row_bytes, kAlign);
  w.dq_acc = align_up(
      w.sems + sizeof(int32_t) * static_cast<size_t>(heads_q * (w.row_len / kBwdTileRows)), kAlign);
  w.bytes = w.dq_acc + sizeof(float) * static_cast<size_t>(total_q * heads_q * head_dim);
  return w;
}

}  // namespace jfa::sm90
