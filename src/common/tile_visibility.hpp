// visibility.hpp's rule for blocks of rows and keys, for the loops and work lists that skip or
// mask whole tiles: the keys a block of rows sees, the rows that see a block of keys (the
// transposed form, for passes that walk query rows under a fixed key tile), and whether a block
// needs the mask at all. Host and device code alike: constexpr, no library calls.
//
// Row i sees key j iff diagonal(i) - left <= j <= diagonal(i) + right with diagonal(i) = i + len_k
// - len_q (a bound of -1 unbounded), both bounds growing by one a row: the rows that see any key
// and the keys a block of rows sees are each one interval.
#pragma once

#include <cstdint>

#include "common/visibility.hpp"

namespace jfa::detail {

// [begin, end); empty when end <= begin.
struct Span {
  int64_t begin = 0;
  int64_t end = 0;
  JFA_HOST_DEVICE constexpr bool empty() const { return end <= begin; }
  JFA_HOST_DEVICE constexpr int64_t size() const { return empty() ? 0 : end - begin; }
};

JFA_HOST_DEVICE constexpr int64_t clamp_to(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// The rows of a sequence that see at least one key: a row below the keys' end under `left` (always,
// as left >= 0) and from the first row whose right bound reaches key 0.
JFA_HOST_DEVICE constexpr Span rows_seeing_any_key(const Window& w, int64_t len_q, int64_t len_k) {
  if (len_q <= 0 || len_k <= 0) return {};
  const int64_t first = w.right < 0 ? 0 : clamp_to(len_q - len_k - w.right, 0, len_q);
  return {first, len_q};
}

// The keys that some row of [row0, row_end) sees (rows outside [0, len_q) see none); empty when no
// row of the block sees a key.
JFA_HOST_DEVICE constexpr Span keys_seen_by_rows(const Window& w, int64_t row0, int64_t row_end,
                                                 int64_t len_q, int64_t len_k) {
  const Span seeing = rows_seeing_any_key(w, len_q, len_k);
  const int64_t lo = row0 > seeing.begin ? row0 : seeing.begin;
  const int64_t hi = row_end < seeing.end ? row_end : seeing.end;
  if (hi <= lo) return {};
  return {first_visible_key(w, lo, len_q, len_k), key_end(w, hi - 1, len_q, len_k)};
}

// The rows that see some key of [key0, key_end_) (keys outside [0, len_k) are seen by none).
JFA_HOST_DEVICE constexpr Span rows_seeing_keys(const Window& w, int64_t key0, int64_t key_end_,
                                                int64_t len_q, int64_t len_k) {
  const int64_t k0 = clamp_to(key0, 0, len_k), k1 = clamp_to(key_end_, 0, len_k);
  if (k1 <= k0 || len_q <= 0) return {};
  const int64_t shift = len_k - len_q;  // row i's diagonal is key i + shift
  // Key j is seen by rows j - shift - right .. j - shift + left.
  const int64_t first = w.right < 0 ? 0 : clamp_to(k0 - shift - w.right, 0, len_q);
  const int64_t end = w.left < 0 ? len_q : clamp_to(k1 - shift + w.left, 0, len_q);
  return {first, end > first ? end : first};
}

// Whether every row of [row0, row_end) inside the sequence sees every key of [key0, key_end_):
// then no element of the block needs the mask (keys past len_k are hidden, so a block reaching past
// them always does; a block without rows of the sequence needs none).
JFA_HOST_DEVICE constexpr bool block_fully_visible(const Window& w, int64_t row0, int64_t row_end,
                                                   int64_t key0, int64_t key_end_, int64_t len_q,
                                                   int64_t len_k) {
  const int64_t lo = row0 > 0 ? row0 : 0, hi = row_end < len_q ? row_end : len_q;
  if (hi <= lo || key_end_ <= key0) return true;
  if (key0 < 0 || key_end_ > len_k) return false;
  // The first visible key grows with the row and the end too: the last row bounds the start, the
  // first row the end.
  return first_visible_key(w, hi - 1, len_q, len_k) <= key0 &&
         key_end(w, lo, len_q, len_k) >= key_end_;
}

}  // namespace jfa::detail
