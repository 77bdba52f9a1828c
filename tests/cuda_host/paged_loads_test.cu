// Which loads the chunked prefill's producer takes (cuda/sm90/paged/paged_loads.hpp), as host code:
// the TMA boxes lie inside one page and one tile, are never under 8 rows, and TMA loads the pages
// wherever such boxes cover them unless the variable asks for the row copies. The splits
// of its keys (paged_prefill_splits.hpp): only where the items leave SMs idle, never below a few
// tiles a split, and a workspace that holds the partials of any device's plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "cuda/sm90/forward/work_items.cuh"
#include "cuda/sm90/host/env_switch.hpp"
#include "cuda/sm90/paged/paged_loads.hpp"
#include "cuda/sm90/paged/paged_prefill_splits.hpp"

namespace {

using jfa::sm90::kPagedTmaMinBoxRows;
using jfa::sm90::paged_loads_for;
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

// Over page sizes, tile positions and key counts: the TMA rows are whole boxes inside the keys,
// each box inside one page; the next box reaches past the keys; the tail's keys lie in one page.
TEST(PagedLoads, TmaRowsAreWholeBoxesInsideTheKeysAndTheTailOnePage) {
  std::mt19937 rng(20261207);
  int checked = 0;
  for (int32_t block_n : {64, 128}) {
    for (int32_t page = 8; page <= 1024; page += 8) {
      const int32_t box = paged_tma_box_rows(page, block_n);
      ASSERT_GE(box, kPagedTmaMinBoxRows);
      for (int trial = 0; trial < 40; ++trial) {
        const int32_t len_k = 1 + static_cast<int32_t>(rng() % 5000);
        const int32_t tiles = (len_k + block_n - 1) / block_n;
        const int32_t first_key = static_cast<int32_t>(rng() % tiles) * block_n;
        const int32_t rows = jfa::sm90::paged_tma_rows(first_key, len_k, box, block_n);
        SCOPED_TRACE("page " + std::to_string(page) + " tile " + std::to_string(block_n) +
                     " first_key " + std::to_string(first_key) + " len_k " + std::to_string(len_k));
        ASSERT_EQ(rows % box, 0);
        ASSERT_TRUE(rows >= 0 && rows <= block_n);
        EXPECT_LE(first_key + rows, len_k);
        for (int32_t r = 0; r < rows; r += box) {
          const int32_t key = first_key + r;
          EXPECT_EQ(key / page, (key + box - 1) / page) << "a box across pages";
        }
        if (rows < block_n) {
          EXPECT_GT(first_key + rows + box, len_k) << "a whole box left to the tail";
          const int32_t tail_end = std::min(len_k, first_key + block_n);
          if (first_key + rows < tail_end)  // the tail holds keys
            EXPECT_EQ((first_key + rows) / page, (tail_end - 1) / page) << "a tail across pages";
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10000);
  EXPECT_EQ(jfa::sm90::paged_tma_rows(256, 256, 16, 128), 0);  // no key in the tile
}

// JFA_CUDA_PAGED_LOADS asks for the row copies with exactly "rows" (env_switch.hpp's env_is).
TEST(PagedLoads, RowsNamedByTheVariable) {
  const char* name = "JFA_CUDA_PAGED_LOADS";
  setenv(name, "rows", 1);
  EXPECT_TRUE(jfa::sm90::env_is(name, "rows"));
  unsetenv(name);
  EXPECT_FALSE(jfa::sm90::env_is(name, "rows")) << "(unset)";
  for (const char* other : {"", "row", "rows ", "ROWS", "tma", "0", "1"}) {
    setenv(name, other, 1);
    EXPECT_FALSE(jfa::sm90::env_is(name, "rows")) << other;
  }
  unsetenv(name);
}

TEST(PagedLoads, TmaWherePagesComeInBoxesUnlessRowsAreAsked) {
  constexpr auto kRows = PagedLoads::kRowsByCpAsync;
  constexpr auto kTma = PagedLoads::kPagesByTma;
  // TMA boxes need pages of 8 rows or a multiple of 8, at 128-key tiles and at 64 (head_dim 256).
  for (int32_t block_n : {128, 64}) {
    for (int32_t page : {1, 2, 4, 5, 12, 20}) {
      EXPECT_EQ(paged_loads_for(false, page, 1000, block_n), kRows) << page;
      EXPECT_EQ(paged_loads_for(true, page, 1000, block_n), kRows) << page;
    }
    for (int32_t page : {8, 16, 24, 48, 64, 128, 256, 1000}) {
      EXPECT_EQ(paged_loads_for(false, page, 1000, block_n), kTma) << page;
      EXPECT_EQ(paged_loads_for(true, page, 1000, block_n), kRows) << page;
    }
  }
  EXPECT_EQ(paged_loads_for(false, 0, 1000, 128), kRows);
  static_assert(kPagedTmaMinBoxRows == 8, "the 128-byte swizzle's 8-row atom");
  // The out-of-bounds stand-in for an invalid entry (num_pages) must be an int32 coordinate.
  EXPECT_EQ(paged_loads_for(false, 16, INT32_MAX - 1, 128), kTma);
  EXPECT_EQ(paged_loads_for(false, 16, INT32_MAX, 128), kRows);
  EXPECT_EQ(paged_loads_for(false, 16, INT64_MAX, 128), kRows);
  // No page: the stand-in 0 would lie inside a map of one page (its dims are at least 1).
  EXPECT_EQ(paged_loads_for(false, 16, 1, 128), kTma);
  EXPECT_EQ(paged_loads_for(false, 16, 0, 128), kRows);
}

using jfa::sm90::kPrefillMaxKeySplits;
using jfa::sm90::kPrefillMinSplitTiles;
using jfa::sm90::prefill_key_splits;
using jfa::sm90::prefill_partials;
using jfa::sm90::prefill_partials_bytes;

TEST(PrefillKeySplits, WhereTheItemsLeaveSmsIdle) {
  // One chunk of 256 tokens on 32 heads (64 items) over 4k and 8k keys on an H100's 132 SMs: two
  // splits fill one wave; eight chunks (512 items) fill the SMs without.
  EXPECT_EQ(prefill_key_splits(64, 32, 132), 2);
  EXPECT_EQ(prefill_key_splits(64, 64, 132), 2);
  EXPECT_EQ(prefill_key_splits(512, 32, 132), 1);
  EXPECT_EQ(prefill_key_splits(132, 32, 132), 1);
  EXPECT_EQ(prefill_key_splits(16, 64, 132), 8);
  EXPECT_EQ(prefill_key_splits(0, 32, 132), 1);
  EXPECT_EQ(prefill_key_splits(64, 0, 132), 1);
  for (int64_t items : {1, 7, 33, 64, 100, 131, 132, 133, 300, 1000}) {
    for (int64_t tiles : {1, 3, 4, 7, 8, 16, 32, 64, 256}) {
      for (int sms : {1, 8, 78, 114, 132, 1000}) {
        const int32_t s = prefill_key_splits(items, tiles, sms);
        SCOPED_TRACE(std::to_string(items) + " items, " + std::to_string(tiles) + " tiles, " +
                     std::to_string(sms) + " SMs");
        ASSERT_GE(s, 1);
        EXPECT_LE(s, kPrefillMaxKeySplits);
        if (s > 1) EXPECT_GE(tiles / s, kPrefillMinSplitTiles);
        // Items in whole waves: a split adds waves for no fewer tiles a wave.
        if (items % std::min(sms, 132) == 0) EXPECT_EQ(s, 1);
      }
    }
  }
}

// The splits of an item's K tiles (split_tiles, forward/work_items.cuh) cover each tile once, in
// key order, none longer than the first; a split past the last tile is empty.
TEST(PrefillKeySplits, SplitsCoverEachTileOnce) {
  for (int32_t tiles = 0; tiles <= 70; ++tiles) {
    for (int32_t splits = 1; splits <= kPrefillMaxKeySplits; ++splits) {
      int32_t next = 0;
      for (int32_t s = 0; s < splits; ++s) {
        const jfa::sm90::TileRun run = jfa::sm90::split_tiles(tiles, splits, s);
        SCOPED_TRACE(std::to_string(tiles) + " tiles, split " + std::to_string(s) + " of " +
                     std::to_string(splits));
        ASSERT_GE(run.count, 0);
        if (run.count == 0) continue;
        EXPECT_EQ(run.first, next);
        EXPECT_LE(run.count, (tiles + splits - 1) / splits);
        next = run.first + run.count;
      }
      EXPECT_EQ(next, tiles) << tiles << " tiles in " << splits << " splits";
    }
  }
}

TEST(PrefillKeySplits, PartialsHoldEveryRowOfEverySplit) {
  EXPECT_EQ(prefill_partials(1000, 8, 128, 1).bytes, 0u);
  const auto p = prefill_partials(1000, 8, 128, 3);
  EXPECT_GE(p.ml_offset, size_t{3} * 1000 * 8 * 128 * 4);
  EXPECT_EQ(p.ml_offset % 256, 0u);
  EXPECT_EQ(p.bytes, p.ml_offset + size_t{3} * 1000 * 8 * 8);
  // The size query's answer covers the plan of any device up to 132 SMs.
  for (int sms : {1, 2, 60, 66, 132})
    EXPECT_GE(prefill_partials_bytes(64, 32, 256, 32, 128),
              prefill_partials(256, 32, 128, prefill_key_splits(64, 32, sms)).bytes);
}

}  // namespace
