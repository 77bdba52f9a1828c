// Which loads the chunked prefill's producer takes (cuda/sm90/paged/paged_loads.hpp), as host code:
// the TMA boxes lie inside one page and one tile, are never under 8 rows, and the loads built for
// measurement are taken only where the variable asks for them and the call allows them.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/sm90/paged/paged_loads.hpp"

namespace {

using jfa::sm90::kPagedTmaMinBoxRows;
using jfa::sm90::paged_loads_for;
using jfa::sm90::paged_loads_named;
using jfa::sm90::paged_tma_box_rows;
using jfa::sm90::PagedLoads;

TEST(PagedLoads, TmaBoxesLieInsideOnePageAndOneTile) {
  for (int32_t block_n : {64, 128}) {
    for (int32_t page = 1; page <= 1024; ++page) {
      const int32_t rows = paged_tma_box_rows(page, block_n);
      SCOPED_TRACE("page " + std::to_string(page) + ", tile " + std::to_string(block_n));
      ASSERT_GT(rows, 0);
      EXPECT_EQ(rows & (rows - 1), 0) << rows << " is not a power of two";
      EXPECT_EQ(page % rows, 0);
      EXPECT_EQ(block_n % rows, 0);
      // The largest such box: twice as many rows would leave the page or the tile.
      EXPECT_TRUE(page % (2 * rows) != 0 || block_n % (2 * rows) != 0);
    }
  }
  EXPECT_EQ(paged_tma_box_rows(16, 128), 16);
  EXPECT_EQ(paged_tma_box_rows(48, 128), 16);
  EXPECT_EQ(paged_tma_box_rows(24, 128), 8);
  EXPECT_EQ(paged_tma_box_rows(256, 128), 128);
  EXPECT_EQ(paged_tma_box_rows(1000, 128), 8);
  EXPECT_EQ(paged_tma_box_rows(12, 128), 4);
}

TEST(PagedLoads, NamedByTheVariable) {
  EXPECT_EQ(paged_loads_named(nullptr), PagedLoads::kRowsByCpAsync);
  EXPECT_EQ(paged_loads_named(""), PagedLoads::kRowsByCpAsync);
  EXPECT_EQ(paged_loads_named("ahead"), PagedLoads::kRowsLookedUpAhead);
  EXPECT_EQ(paged_loads_named("tma"), PagedLoads::kPagesByTma);
  for (const char* other : {"tm", "tmax", "TMA", "ahead ", "1", "rows"})
    EXPECT_EQ(paged_loads_named(other), PagedLoads::kRowsByCpAsync) << other;
}

TEST(PagedLoads, TakenOnlyWhereAskedForAndAllowed) {
  constexpr auto kShipped = PagedLoads::kRowsByCpAsync;
  constexpr auto kAhead = PagedLoads::kRowsLookedUpAhead;
  constexpr auto kTma = PagedLoads::kPagesByTma;
  constexpr auto kBf16 = JFA_DTYPE_BFLOAT16;
  for (PagedLoads asked : {kShipped, kAhead, kTma}) {
    for (int32_t d : {64, 128}) {
      EXPECT_EQ(paged_loads_for(asked, kBf16, d, 16, 1000, 128), asked);
      // Built for bf16 at 64 and 128 only.
      EXPECT_EQ(paged_loads_for(asked, JFA_DTYPE_FLOAT16, d, 16, 1000, 128), kShipped);
    }
    EXPECT_EQ(paged_loads_for(asked, kBf16, 256, 16, 1000, 64), kShipped);
  }
  // Rows looked up ahead take every page size; TMA boxes need pages of 8 rows or a multiple of 8.
  for (int32_t page : {1, 2, 4, 5, 12, 20})
    EXPECT_EQ(paged_loads_for(kTma, kBf16, 128, page, 1000, 128), kShipped) << page;
  for (int32_t page : {8, 16, 24, 48, 64, 128, 256, 1000})
    EXPECT_EQ(paged_loads_for(kTma, kBf16, 128, page, 1000, 128), kTma) << page;
  for (int32_t page : {1, 5, 16, 256})
    EXPECT_EQ(paged_loads_for(kAhead, kBf16, 128, page, 1000, 128), kAhead) << page;
  static_assert(kPagedTmaMinBoxRows == 8, "the 128-byte swizzle's 8-row atom");
  // The out-of-bounds stand-in for an invalid entry (num_pages) must be an int32 coordinate.
  EXPECT_EQ(paged_loads_for(kTma, kBf16, 128, 16, INT32_MAX - 1, 128), kTma);
  EXPECT_EQ(paged_loads_for(kTma, kBf16, 128, 16, INT32_MAX, 128), kShipped);
  // No page: the stand-in 0 would lie inside a map of one page (its dims are at least 1).
  EXPECT_EQ(paged_loads_for(kTma, kBf16, 128, 16, 1, 128), kTma);
  EXPECT_EQ(paged_loads_for(kTma, kBf16, 128, 16, 0, 128), kShipped);
  EXPECT_EQ(paged_loads_for(kAhead, kBf16, 128, 16, INT64_MAX, 128), kAhead);
}

}  // namespace
