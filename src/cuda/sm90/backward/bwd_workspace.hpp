// Layout of the backward's device workspace (see jfa_attention_backward_workspace_size): a header
// (the work list's entry count and the item counter), the work list (one entry per K tile or per
// tile shared by short sequences), the per-row softmax terms of the preprocess (LSE in base 2 and
// D = rowsum(dO * O) - dLSE, each [heads_q, row_len] with row = query token, the D rows right
// after the LSE rows, then both again one row later: row t + 1 holds token t, so that a step whose
// first token is odd reads its terms from an even row), one semaphore per q tile of a sequence and
// head (deterministic mode; numbered as if every sequence's rows were padded to whole q tiles), a
// bit per query token whose row of dq a shared tile stores (its accumulator row is then neither
// cleared nor converted), the float32 accumulator of dQ and, where the call splits its items by
// query heads (bwd_head_splits.hpp), those of dK and dV.
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

// Query rows of a q tile: the unit of the deterministic semaphores and of a dQ reduction (a step
// of the kernel takes one or two q tiles).
inline constexpr int kBwdTileRows = 64;
inline constexpr int kBwdBlockN = 128;  // keys per backward work item (two consumer groups of 64)
// Keys per work item from head_dim 192 up, where both consumer groups take the same 64 keys
// (BwdConfig::kSplitRoles); the work list's capacity counts tiles of this size.
inline constexpr int kBwdMinBlockN = 64;

// The float32 dQ accumulator, total_q x heads_q x head_dim floats (no padding), laid out so that
// the rows of one q tile and the columns of one dQ part of one head are contiguous: parts of
// dq_part_cols(head_dim) columns (all of them up to 96, half from 128 up: one consumer group's),
// part (head, col / part columns) holding every token's floats in token order, the 16-byte
// chunks of token t's row permuted by 2 (t % 4) within each run of eight. A thread of the MMA
// fragment stages two adjacent chunks' halves of one row; with that permutation the four rows of a
// half warp (whose 8-byte stores go together) fall on different banks. A q tile's rows of a part
// are what one bulk reduction adds.
JFA_HOST_DEVICE constexpr int dq_part_cols(int64_t head_dim) {
  return static_cast<int>(head_dim <= 96 ? head_dim : head_dim / 2);
}
JFA_HOST_DEVICE constexpr int64_t dq_part_base(int64_t total_q, int64_t head_dim, int64_t head,
                                               int64_t part) {
  return (head * (head_dim / dq_part_cols(head_dim)) + part) * total_q * dq_part_cols(head_dim);
}
// col in [0, part columns), a multiple of 32: the permutation stays inside each run of 8 chunks.
JFA_HOST_DEVICE constexpr int dq_chunk_offset(int64_t token, int col) {
  return (((col >> 2) ^ (static_cast<int>(token & 3) << 1)) << 2) + (col & 3);
}
JFA_HOST_DEVICE constexpr int64_t dq_acc_offset(int64_t total_q, int64_t head_dim, int64_t token,
                                                int64_t head, int col) {  // col in [0, head_dim)
  const int cols = dq_part_cols(head_dim);
  return dq_part_base(total_q, head_dim, head, col / cols) + token * cols +
         dq_chunk_offset(token, col % cols);
}

// Short sequences share a work item: at most kBwdBlockN keys and kBwdPackRows query rows of
// consecutive sequences, whose rows the item's steps walk together (a q row of the item then gets
// dQ from that item only).
inline constexpr int kBwdPackRows = 128;

// One entry of the backward's work list: K tile n_block of sequence `seq`, which has n_tiles K
// tiles (the tiles of one sequence are consecutive entries, n_block ascending), or (n_seqs > 1)
// one tile shared by the short sequences seq .. seq + n_seqs - 1 (n_block 0, n_tiles 1).
struct BwdListEntry {
  int32_t seq;
  int32_t n_block;
  int32_t n_tiles;
  int32_t n_seqs;
};

// Whether query token t's row of dq is stored by its shared tile, without the accumulator (bit
// t % 32 of word t / 32 of the stored rows; none without them).
JFA_HOST_DEVICE constexpr bool is_stored_row(const uint32_t* bits, int64_t t) {
  return bits != nullptr && ((bits[t >> 5] >> (t & 31)) & 1u);
}

// Semaphore number of sequence b's first q tile (per head): the q tiles of every sequence before
// it, counted as if each sequence's rows started on a whole q tile (from its first token q_start).
JFA_HOST_DEVICE constexpr int64_t first_sem_tile(int64_t q_start, int64_t b) {
  return (q_start + b * kBwdTileRows) / kBwdTileRows;
}

// The per-row terms' arrays, each heads_q rows of row_len floats: LSE, D, and both shifted by one
// row; the shifted LSE rows start at row kShiftedRowTerms * heads_q.
inline constexpr int kRowTermArrays = 4;
inline constexpr int kShiftedRowTerms = 2;

struct BwdWorkspaceLayout {
  int64_t list_capacity;  // entries, at least the K tiles and shared tiles of any offsets
  int64_t row_len;        // rows per head of the per-row arrays (total_q + 1, rounded up)
  int64_t sem_tiles;      // semaphores per head
  // Byte offsets, and the total; key_grads_acc: dK's accumulator then dV's (key_grads_bytes, 0
  // without head splits).
  size_t list, lse2, dpsum, sems, stored_rows, dq_acc, key_grads_acc, key_grads_bytes, bytes;
  // The semaphores and the stored rows' bits, cleared per call.
  size_t zeroed_bytes() const { return dq_acc - sems; }
};

constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// key_grad_floats: head_split_accumulator_floats (0 without head splits).
constexpr BwdWorkspaceLayout backward_workspace_layout(int64_t total_q, int64_t total_k,
                                                       int64_t batch, int64_t heads_q,
                                                       int64_t head_dim,
                                                       int64_t key_grad_floats = 0) {
  BwdWorkspaceLayout w{};
  w.list_capacity = (total_k + kBwdMinBlockN - 1) / kBwdMinBlockN + batch;
  // Every token and the shifted copy's last, in whole q tiles (at least two). The preprocess
  // writes every row up to row_len, and TMA reads a row past it as zeros: a step that reaches past
  // total_q reads defined values, which it masks as rows past its sequence's end.
  w.row_len = static_cast<int64_t>(align_up(static_cast<size_t>(total_q + 1), kBwdTileRows));
  if (w.row_len < 2 * kBwdTileRows) w.row_len = 2 * kBwdTileRows;
  w.sem_tiles = first_sem_tile(total_q, batch) + 1;
  constexpr size_t kAlign = 256;
  w.list = 16;
  w.lse2 = align_up(w.list + sizeof(BwdListEntry) * static_cast<size_t>(w.list_capacity), kAlign);
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(heads_q * w.row_len);
  w.dpsum = w.lse2 + row_bytes;  // right after the LSE rows: one tensor map covers all four
  w.sems = align_up(w.lse2 + kRowTermArrays * row_bytes, kAlign);
  w.stored_rows =
      align_up(w.sems + sizeof(int32_t) * static_cast<size_t>(heads_q * w.sem_tiles), kAlign);
  w.dq_acc =
      align_up(w.stored_rows + sizeof(uint32_t) * static_cast<size_t>((total_q + 31) / 32), kAlign);
  w.key_grads_acc = align_up(
      w.dq_acc + sizeof(float) * static_cast<size_t>(total_q * heads_q * head_dim), kAlign);
  w.key_grads_bytes = sizeof(float) * static_cast<size_t>(key_grad_floats);
  w.bytes = key_grad_floats > 0
                ? w.key_grads_acc + w.key_grads_bytes
                : w.dq_acc + sizeof(float) * static_cast<size_t>(total_q * heads_q * head_dim);
  return w;
}

}  // namespace jfa::sm90
