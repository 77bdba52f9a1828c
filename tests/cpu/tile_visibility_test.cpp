// The block forms of the visibility rule (tile_visibility.hpp) against the per-element rule of
// visibility.hpp, exhaustively over small sequences, windows and blocks, including rows and keys
// outside the sequence and empty sequences.
#include "common/tile_visibility.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using jfa::detail::Span;
using jfa::detail::Window;

bool sees(const Window& w, int64_t i, int64_t j, int64_t len_q, int64_t len_k) {
  if (i < 0 || i >= len_q || j < 0 || j >= len_k) return false;
  return jfa::detail::first_visible_key(w, i, len_q, len_k) <= j &&
         j < jfa::detail::key_end(w, i, len_q, len_k);
}

// The smallest interval holding every index where `hit` holds, and whether every index inside it
// does (the block forms promise one interval).
template <typename Hit>
Span hull(int64_t lo, int64_t hi, Hit hit, bool* contiguous) {
  Span s{0, 0};
  bool any = false;
  for (int64_t x = lo; x < hi; ++x) {
    if (!hit(x)) continue;
    if (!any) s.begin = x;
    s.end = x + 1;
    any = true;
  }
  *contiguous = true;
  for (int64_t x = s.begin; x < s.end; ++x) *contiguous &= hit(x);
  return any ? s : Span{};
}

std::vector<Window> windows() {
  std::vector<Window> out;
  for (int32_t left : {-1, 0, 1, 3, 9})
    for (int32_t right : {-1, 0, 1, 4}) out.push_back({left, right});
  return out;
}

void expect_span(const Span& got, const Span& want, const char* what) {
  if (want.empty()) {
    EXPECT_TRUE(got.empty()) << what << ": got [" << got.begin << ", " << got.end << ")";
  } else {
    EXPECT_EQ(got.begin, want.begin) << what;
    EXPECT_EQ(got.end, want.end) << what;
  }
}

TEST(TileVisibility, BlockFormsMatchTheElementRule) {
  int64_t checked = 0;
  for (const Window& w : windows())
    for (int64_t len_q : {0, 1, 2, 5, 11})
      for (int64_t len_k : {0, 1, 3, 5, 12}) {
        SCOPED_TRACE(testing::Message() << "left=" << w.left << " right=" << w.right
                                        << " len_q=" << len_q << " len_k=" << len_k);
        bool contiguous = false;
        const Span rows_any = hull(
            -3, len_q + 3,
            [&](int64_t i) {
              for (int64_t j = 0; j < len_k; ++j)
                if (sees(w, i, j, len_q, len_k)) return true;
              return false;
            },
            &contiguous);
        EXPECT_TRUE(contiguous);
        expect_span(jfa::detail::rows_seeing_any_key(w, len_q, len_k), rows_any, "rows seeing any");
        for (int64_t a = -2; a <= len_q + 2; ++a)
          for (int64_t b = a; b <= len_q + 3; ++b) {
            const Span want = hull(
                -3, len_k + 3,
                [&](int64_t j) {
                  for (int64_t i = a; i < b; ++i)
                    if (sees(w, i, j, len_q, len_k)) return true;
                  return false;
                },
                &contiguous);
            EXPECT_TRUE(contiguous);
            expect_span(jfa::detail::keys_seen_by_rows(w, a, b, len_q, len_k), want,
                        "keys seen by rows");
            ++checked;
          }
        for (int64_t a = -2; a <= len_k + 2; ++a)
          for (int64_t b = a; b <= len_k + 3; ++b) {
            const Span want = hull(
                -3, len_q + 3,
                [&](int64_t i) {
                  for (int64_t j = a; j < b; ++j)
                    if (sees(w, i, j, len_q, len_k)) return true;
                  return false;
                },
                &contiguous);
            EXPECT_TRUE(contiguous);
            expect_span(jfa::detail::rows_seeing_keys(w, a, b, len_q, len_k), want,
                        "rows seeing keys");
            ++checked;
          }
        for (int64_t r0 = -1; r0 <= len_q + 1; ++r0)
          for (int64_t r1 = r0; r1 <= len_q + 2; ++r1)
            for (int64_t k0 = -1; k0 <= len_k + 1; ++k0)
              for (int64_t k1 = k0; k1 <= len_k + 2; ++k1) {
                bool all = true;
                for (int64_t i = r0 < 0 ? 0 : r0; i < r1 && i < len_q; ++i)
                  for (int64_t j = k0; j < k1; ++j) all &= sees(w, i, j, len_q, len_k);
                EXPECT_EQ(jfa::detail::block_fully_visible(w, r0, r1, k0, k1, len_q, len_k), all)
                    << "rows [" << r0 << ", " << r1 << ") keys [" << k0 << ", " << k1 << ")";
                ++checked;
              }
      }
  EXPECT_GT(checked, 100000);
}

}  // namespace
