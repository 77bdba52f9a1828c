// The CUDA backward's workspace layout (host arithmetic only): the per-row arrays hold a row per
// query token, the deterministic semaphores number every q tile of every sequence without overlap
// and without leaving their array, also for offsets the kernels clamp from invalid input, and the
// regions of the workspace do not overlap; and the head splits' rule and accumulators.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "cuda/sm90/backward/bwd_head_splits.hpp"
#include "cuda/sm90/backward/bwd_workspace.hpp"
#include "test_seed.hpp"

namespace {

using jfa::sm90::backward_workspace_layout;
using jfa::sm90::BwdWorkspaceLayout;
using jfa::sm90::first_sem_tile;
using jfa::sm90::kBwdMinBlockN;
using jfa::sm90::kBwdTileRows;

int64_t tiles(int64_t len, int64_t block) { return (len + block - 1) / block; }

// Every sequence's q tiles have semaphores [first_sem_tile(b), first_sem_tile(b + 1)) inside the
// semaphore array, and every token a row of the per-row arrays.
void expect_tiles_fit(const std::vector<int64_t>& lengths) {
  const int64_t batch = static_cast<int64_t>(lengths.size());
  int64_t total = 0;
  for (int64_t len : lengths) total += len;
  const BwdWorkspaceLayout lay = backward_workspace_layout(total, total, batch, 4, 128);
  int64_t start = 0, prev_end = 0, k_tiles = 0;
  for (int64_t b = 0; b < batch; ++b) {
    k_tiles += tiles(lengths[b], kBwdMinBlockN);  // the smaller K tiles: the most entries
    const int64_t first = first_sem_tile(start, b);
    EXPECT_GE(first, prev_end) << "sequence " << b << " overlaps the one before";
    prev_end = first + tiles(lengths[b], kBwdTileRows);
    EXPECT_LE(prev_end, lay.sem_tiles) << "sequence " << b << " runs past the semaphores";
    start += lengths[b];
  }
  EXPECT_GE(lay.row_len, total + 1) << "the shifted copy's last row";
  EXPECT_GE(lay.row_len, 2 * kBwdTileRows) << "a two-tile step's rows of the terms";
  EXPECT_LE(k_tiles, lay.list_capacity) << "the work list has no room for every K tile";
}

TEST(BackwardWorkspace, EveryTileHasItsOwnSemaphore) {
  expect_tiles_fit({});
  expect_tiles_fit({0});
  expect_tiles_fit({1});
  expect_tiles_fit({0, 0, 0, 1, 0});
  expect_tiles_fit({63, 64, 65, 127, 128, 129, 4096});
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (int round = 0; round < 200; ++round) {
    std::vector<int64_t> lengths(1 + rng() % 300);
    const int64_t cap = round % 2 ? 70 : 3000;
    for (int64_t& len : lengths) len = static_cast<int64_t>(rng() % cap);
    expect_tiles_fit(lengths);
  }
}

// The kernels clamp a sequence's start into [0, total] and its end into [start, total]: whatever
// the offsets, the semaphores of a tile they walk stay inside their array.
TEST(BackwardWorkspace, ClampedOffsetsStayInside) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (int round = 0; round < 2000; ++round) {
    const int64_t total = static_cast<int64_t>(rng() % 5000);
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 64);
    const BwdWorkspaceLayout lay = backward_workspace_layout(total, total, batch, 2, 64);
    const int64_t b = static_cast<int64_t>(rng() % batch);
    const int64_t start = static_cast<int64_t>(rng() % (total + 1));
    const int64_t len = static_cast<int64_t>(rng() % (total - start + 1));
    EXPECT_LE(first_sem_tile(start, b) + tiles(len, kBwdTileRows), lay.sem_tiles)
        << "total " << total << " batch " << batch << " b " << b << " start " << start << " len "
        << len;
  }
}

TEST(BackwardWorkspace, RegionsAreAlignedAndDisjoint) {
  for (int64_t total_q : {int64_t{0}, int64_t{1}, int64_t{777}, int64_t{65536}})
    for (int64_t total_k : {int64_t{0}, int64_t{129}, int64_t{65536}})
      for (int64_t batch : {int64_t{1}, int64_t{32}, int64_t{4096}})
        for (int64_t heads : {int64_t{1}, int64_t{16}})
          for (int64_t d : {int64_t{64}, int64_t{128}}) {
            const BwdWorkspaceLayout lay =
                backward_workspace_layout(total_q, total_k, batch, heads, d);
            const size_t row_bytes = sizeof(float) * static_cast<size_t>(heads * lay.row_len);
            EXPECT_EQ(lay.row_len % kBwdTileRows, 0);
            EXPECT_GE(lay.list, size_t{16});
            EXPECT_LE(
                lay.list + sizeof(jfa::sm90::BwdListEntry) * static_cast<size_t>(lay.list_capacity),
                lay.lse2);
            EXPECT_EQ(lay.lse2 % 256, 0u);
            // One tensor map covers the LSE rows, the D rows after them and both shifted.
            EXPECT_EQ(lay.dpsum, lay.lse2 + row_bytes);
            EXPECT_LE(lay.dpsum + 3 * row_bytes, lay.sems);
            EXPECT_LE(lay.sems + sizeof(int32_t) * static_cast<size_t>(heads * lay.sem_tiles),
                      lay.stored_rows);
            EXPECT_LE(lay.stored_rows + sizeof(uint32_t) * static_cast<size_t>((total_q + 31) / 32),
                      lay.dq_acc);
            EXPECT_EQ(lay.dq_acc % 256, 0u);
            // The semaphores and the stored rows' bits are what is cleared (the preprocess clears
            // the accumulator's rows).
            EXPECT_EQ(lay.bytes,
                      lay.dq_acc + sizeof(float) * static_cast<size_t>(total_q * heads * d));
            EXPECT_EQ(lay.zeroed_bytes(), lay.dq_acc - lay.sems);
          }
}

// The accumulator's layout: every (token, head, column) has its own float inside total_q x heads x
// d, a q tile's rows of one part (64 columns, or all 32 or 96) are contiguous (what one bulk
// reduction adds), and the pairs (c, c + 1), c even, that the kernel stages stay adjacent.
TEST(BackwardWorkspace, DqAccumulatorLayoutIsAPermutation) {
  EXPECT_EQ(jfa::sm90::dq_part_cols(32), 32);
  EXPECT_EQ(jfa::sm90::dq_part_cols(96), 96);
  EXPECT_EQ(jfa::sm90::dq_part_cols(128), 64);
  EXPECT_EQ(jfa::sm90::dq_part_cols(192), 96);
  EXPECT_EQ(jfa::sm90::dq_part_cols(256), 128);
  for (int d : {32, 64, 96, 128, 192, 256})
    for (int64_t total_q : {1, 7, 64, 131}) {
      const int64_t heads = 3;
      std::vector<int> seen(static_cast<size_t>(total_q * heads * d), 0);
      for (int64_t t = 0; t < total_q; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int c = 0; c < d; ++c) {
            const int64_t at = jfa::sm90::dq_acc_offset(total_q, d, t, h, c);
            ASSERT_GE(at, 0);
            ASSERT_LT(at, static_cast<int64_t>(seen.size()));
            ++seen[static_cast<size_t>(at)];
            const int cols = jfa::sm90::dq_part_cols(d);
            const int64_t part = jfa::sm90::dq_part_base(total_q, d, h, c / cols);
            EXPECT_EQ((at - part) / cols, t);
            EXPECT_EQ(at % 4, c % 4);
          }
      for (int n : seen) EXPECT_EQ(n, 1);
    }
}

// Head splits: none in deterministic mode, without grouped heads, or where the items fill the SMs
// (and, bounded, walk at most that many query heads each); else the least divisor of the group
// that brings the items to one per SM (within the bound), or the whole group.
TEST(BackwardWorkspace, HeadSplitsRule) {
  using jfa::sm90::head_splits_for;
  // 2048 keys in 128-key tiles on 2 kv heads: 32 items.
  EXPECT_EQ(head_splits_for(2048, 2, 4, false, 128, 132), 4);  // 128 < 132: the whole group
  EXPECT_EQ(head_splits_for(2048, 2, 8, false, 128, 132), 8);  // 32 x 4 = 128 < 132
  EXPECT_EQ(head_splits_for(2048, 2, 8, false, 128, 128), 4);  // 32 x 4 = 128 SMs
  EXPECT_EQ(head_splits_for(2048, 2, 6, false, 128, 64), 2);
  EXPECT_EQ(head_splits_for(2048, 2, 6, false, 128, 65), 3);
  EXPECT_EQ(head_splits_for(2048, 2, 8, true, 128, 132), 1) << "deterministic";
  EXPECT_EQ(head_splits_for(2048, 8, 1, false, 128, 132), 1) << "no grouped heads";
  EXPECT_EQ(head_splits_for(132 * 128, 1, 8, false, 128, 132), 1) << "the items fill the SMs";
  EXPECT_EQ(head_splits_for(132 * 128, 1, 4, false, 128, 132, 4), 1) << "within the bound";
  EXPECT_EQ(head_splits_for(132 * 128, 1, 8, false, 128, 132, 4), 2) << "at most 4 heads an item";
  EXPECT_EQ(head_splits_for(132 * 128, 1, 16, false, 128, 132, 4), 4);
  EXPECT_EQ(head_splits_for(132 * 128, 1, 16, false, 128, 132, 2), 8);
  EXPECT_EQ(head_splits_for(132 * 128, 1, 6, false, 128, 132, 4), 2) << "3 heads an item";
  EXPECT_EQ(head_splits_for(132 * 128, 1, 5, false, 128, 132, 4), 5) << "a prime group above 4";
  EXPECT_EQ(head_splits_for(132 * 128, 1, 16, true, 128, 132, 4), 1) << "deterministic";
  EXPECT_EQ(head_splits_for(2048, 2, 8, false, 128, 128, 1), 8) << "the bound over the target";
  EXPECT_EQ(head_splits_for(131 * 128, 1, 8, false, 128, 132), 2);
  EXPECT_EQ(head_splits_for(2048, 2, 8, false, 64, 132), 4) << "64-key tiles: twice the items";
  EXPECT_EQ(head_splits_for(0, 2, 8, false, 128, 132), 1) << "no keys";
  EXPECT_EQ(head_splits_for(1, 1, 7, false, 128, 132), 7) << "a prime group: whole or nothing";
  for (int32_t group : {2, 3, 4, 6, 8, 16})
    for (int64_t keys : {1, 100, 1000, 5000, 20000})
      for (bool det : {false, true}) {
        const int32_t s = head_splits_for(keys, 2, group, det, 128, 132);
        EXPECT_EQ(group % s, 0) << "a divisor of the group";
        // The size query's bound (128-key tiles, the most SMs) covers every call that splits.
        if (head_splits_for(keys, 2, group, det, 64, 132) > 1)
          EXPECT_GT(head_splits_for(keys, 2, group, det, 128, jfa::sm90::kHeadSplitsMaxSms), 1);
      }
}

// The knob for splitting long items: 1 unless set, clamped to 1 .. 16.
TEST(BackwardWorkspace, HeadSplitItemsPerSm) {
  using jfa::sm90::head_split_items_per_sm;
  const char* name = "JFA_CUDA_BWD_HEAD_SPLIT_ITEMS_PER_SM";
  unsetenv(name);
  EXPECT_EQ(head_split_items_per_sm(), 1);
  for (const auto& [text, want] : {std::pair{"4", 4}, {"0", 1}, {"-3", 1}, {"99", 16}, {"x", 1}}) {
    setenv(name, text, 1);
    EXPECT_EQ(head_split_items_per_sm(), want) << text;
  }
  unsetenv(name);
  // Aiming at 4 items an SM splits where 1 would not: 512 items of 16 query heads on 132 SMs.
  EXPECT_EQ(jfa::sm90::head_splits_for(512 * 128, 1, 16, false, 128, 132), 1);
  EXPECT_EQ(jfa::sm90::head_splits_for(512 * 128, 1, 16, false, 128, 4 * 132), 2);
}

// The knob for measuring other slices: a divisor of the group (1: none) replaces the rule's
// slices, anything else (and deterministic mode) leaves the rule's; the bound on heads an item
// where asked.
TEST(BackwardWorkspace, HeadSplitsAsked) {
  using jfa::sm90::chosen_head_splits;
  const char* name = "JFA_CUDA_BWD_HEAD_SPLITS";
  const char* bound = "JFA_CUDA_BWD_HEAD_SPLIT_MAX_HEADS";
  const int64_t keys = 512 * 128;  // 512 K tiles of one kv head: the rule splits none on 132 SMs
  unsetenv(name);
  unsetenv(bound);
  EXPECT_EQ(chosen_head_splits(keys, 1, 16, false, 128, 132), 1);
  EXPECT_EQ(chosen_head_splits(1024, 1, 16, false, 128, 132), 16);  // 8 items: every query head
  const std::pair<const char*, int> asked[] = {{"2", 2},  {"8", 8}, {"16", 16}, {"1", 1}, {"3", 1},
                                               {"32", 1}, {"0", 1}, {"-4", 1},  {"x", 1}};
  for (const auto& [text, want] : asked) {
    setenv(name, text, 1);
    EXPECT_EQ(chosen_head_splits(keys, 1, 16, false, 128, 132), want) << text;
    EXPECT_EQ(chosen_head_splits(keys, 1, 16, true, 128, 132), 1) << text;
  }
  unsetenv(name);
  const std::pair<const char*, int> bounded[] = {{"4", 4}, {"1", 16}, {"16", 1},
                                                 {"0", 1}, {"65", 1}, {"x", 1}};
  for (const auto& [text, want] : bounded) {
    setenv(bound, text, 1);
    EXPECT_EQ(chosen_head_splits(keys, 1, 16, false, 128, 132), want) << text;
  }
  setenv(name, "2", 1);
  setenv(bound, "4", 1);
  EXPECT_EQ(chosen_head_splits(keys, 1, 16, false, 128, 132), 2) << "the asked slices first";
  unsetenv(bound);
  EXPECT_EQ(jfa::sm90::head_splits_asked(1), 0);  // no group to split
  EXPECT_EQ(chosen_head_splits(keys, 4, 1, false, 128, 132), 1);
  unsetenv(name);
}

// The accumulators of dK and dV follow the dQ accumulator, 256-byte aligned; without head splits
// the workspace is what it was.
TEST(BackwardWorkspace, HeadSplitAccumulators) {
  using jfa::sm90::head_split_accumulator_floats;
  EXPECT_EQ(head_split_accumulator_floats(1, 1000, 2, 128, 128), 0);
  EXPECT_EQ(head_split_accumulator_floats(4, 1000, 2, 192, 128), 1000 * 2 * (192 + 128));
  const BwdWorkspaceLayout plain = backward_workspace_layout(777, 1000, 3, 8, 128);
  const int64_t floats = head_split_accumulator_floats(4, 1000, 2, 128, 128);
  const BwdWorkspaceLayout split = backward_workspace_layout(777, 1000, 3, 8, 128, floats);
  EXPECT_EQ(plain.key_grads_bytes, 0u);
  EXPECT_EQ(split.dq_acc, plain.dq_acc);
  EXPECT_GE(split.key_grads_acc, plain.bytes);
  EXPECT_EQ(split.key_grads_acc % 256, 0u);
  EXPECT_EQ(split.key_grads_bytes, sizeof(float) * static_cast<size_t>(floats));
  EXPECT_EQ(split.bytes, split.key_grads_acc + split.key_grads_bytes);
}

}  // namespace
