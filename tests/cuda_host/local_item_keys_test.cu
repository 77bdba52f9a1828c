// The K range of the local-attention kernels' items (local_item_keys, work_items.cuh), run as host
// code: shifting an item's keys to the tile of the first key its rows see keeps every row's window
// (the rule depends on the diagonal i + len_k - len_q alone), the tiles it visits hold every key a
// row sees, and an item whose rows see no key visits none. Windows at their edges, with and
// without the causal mask's right bound, cross lengths, the tile shapes of the kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>

#include "common/visibility.hpp"
#include "cuda/sm90/forward/work_items.cuh"
#include "test_seed.hpp"

namespace {

using jfa::detail::Window;

bool sees(const Window& w, int64_t i, int64_t len_q, int64_t len_k, int64_t j) {
  return j >= jfa::detail::first_visible_key(w, i, len_q, len_k) &&
         j < jfa::detail::key_end(w, i, len_q, len_k);
}

template <int kBlockM, int kBlockN>
void check_item(const Window& w, int32_t len_q, int32_t len_k, int32_t m_block) {
  SCOPED_TRACE(testing::Message() << "block " << kBlockM << "x" << kBlockN << " window (" << w.left
                                  << ", " << w.right << ") len_q " << len_q << " len_k " << len_k
                                  << " m_block " << m_block);
  jfa::sm90::SeqBounds seq{1000, len_q, 5000, len_k};
  const int64_t row0 = static_cast<int64_t>(m_block) * kBlockM;
  const int64_t row_end = std::min<int64_t>(row0 + kBlockM, len_q);
  const int32_t n_blocks = jfa::sm90::local_item_keys<kBlockN>(w, seq, row0, row_end);
  const int32_t shift = seq.k_start - 5000;
  ASSERT_EQ(seq.q_start, 1000);
  ASSERT_EQ(seq.len_q, len_q);
  ASSERT_EQ(shift % kBlockN, 0);
  ASSERT_GE(shift, 0);
  ASSERT_EQ(seq.len_k, len_k - shift);
  bool any = false;
  for (int64_t i = row0; i < row_end; ++i)
    for (int64_t j = 0; j < len_k; ++j) {
      const bool seen = sees(w, i, len_q, len_k, j);
      any |= seen;
      if (seen) {
        // Every key a row sees lies in a visited tile, at or past the shift.
        ASSERT_GE(j, shift) << "row " << i << " key " << j;
        ASSERT_LT(j - shift, static_cast<int64_t>(n_blocks) * kBlockN) << "row " << i;
      }
      // In the shifted keys the same rule gives the same answer.
      if (j >= shift)
        ASSERT_EQ(sees(w, i, len_q, seq.len_k, j - shift), seen) << "row " << i << " key " << j;
    }
  EXPECT_EQ(n_blocks == 0, !any);
  // No visited tile lies wholly past the last key a row sees.
  if (n_blocks > 0) {
    int64_t last = -1;
    for (int64_t i = row0; i < row_end; ++i)
      last = std::max(last, jfa::detail::key_end(w, i, len_q, len_k) - 1);
    EXPECT_LE(static_cast<int64_t>(n_blocks - 1) * kBlockN + shift, last);
  }
}

TEST(LocalItemKeys, VisitedTilesHoldEveryKeyAndTheShiftKeepsTheWindow) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  const int32_t bounds[] = {-1, 0, 1, 5, 63, 64, 65, 127, 200, 1000};
  std::uniform_int_distribution<int32_t> len(0, 420);
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t len_q = trial < 4 ? trial : len(rng), len_k = trial < 4 ? 3 - trial : len(rng);
    for (int32_t left : bounds)
      for (int32_t right : bounds) {
        const Window w{left, right};
        for (int32_t m = 0; m * 128 < len_q; ++m) check_item<128, 128>(w, len_q, len_k, m);
        for (int32_t m = 0; m * 128 < len_q; ++m) check_item<128, 64>(w, len_q, len_k, m);
        for (int32_t m = 0; m * 192 < len_q; ++m) check_item<192, 128>(w, len_q, len_k, m);
        for (int32_t m = 0; m * 128 < len_q; ++m) check_item<128, 160>(w, len_q, len_k, m);
        if (HasFatalFailure()) return;
      }
  }
}

}  // namespace
