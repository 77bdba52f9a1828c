// The order of the Hopper backward's work, run as host code on the item decode the kernel uses
// (decode_bwd_item, walk_q_tile, dq_add_rank, dq_add_of_step): every K tile of every kv head is one
// item (with head splits, one per slice of the kv head's query heads); each item walks the steps
// that hold any query row seeing its keys, once each; every K tile that a q tile's rows see adds to
// that q tile's dQ, and no other; and in deterministic mode the adds to a q tile have ranks 0 .. n
// - 1 in the order the items are claimed, so that each add waits only for items claimed before it
// (which keeps the persistent grid from waiting on an item no CTA holds). Both step shapes (one q
// tile per step, and two, where a group's q tile may lie past the sequence's end or before the rows
// that see the item's keys), both masks, cross lengths, GQA; and a tile shared by short sequences:
// one item per kv head walking all its rows, each row's dQ added once and unranked. The
// local-attention kernels' decode (kLocal: sliding windows, either side or both, with and without
// the causal mask) is held to the same properties under the window's rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "common/tile_visibility.hpp"
#include "cuda/sm90/backward/bwd_work_list.cuh"
#include "test_seed.hpp"

namespace {

using jfa::sm90::BwdArgs;
using jfa::sm90::BwdItem;
using jfa::sm90::BwdListEntry;
using jfa::sm90::kBwdBlockN;
using jfa::sm90::kBwdTileRows;

struct Case {
  std::vector<int32_t> lq, lk;
  int32_t heads_kv = 1, group = 1;
  int32_t splits = 1;  // head splits: items per (K tile, kv head), a divisor of the group
  bool causal = false, deterministic = true;
  jfa::detail::Window window;  // the local kernels' (causal folded in as right = 0)
};

struct Add {
  int32_t rank;
  int64_t claimed;  // the item's index in claim order
  int32_t n_block;
};

// Whether some row of q tile t sees some key of K tile n (bottom-right causal alignment; with
// kLocal, the window's rule).
template <bool kLocal>
bool sees(const Case& c, int32_t len_q, int32_t len_k, int32_t t, int32_t n) {
  if constexpr (kLocal) {
    const jfa::detail::Span keys = jfa::detail::keys_seen_by_rows(
        c.window, int64_t{t} * kBwdTileRows, (int64_t{t} + 1) * kBwdTileRows, len_q, len_k);
    return keys.begin < (int64_t{n} + 1) * kBwdBlockN && keys.end > int64_t{n} * kBwdBlockN &&
           !keys.empty();
  }
  const int64_t last_row = std::min<int64_t>(len_q, (t + 1) * int64_t{kBwdTileRows}) - 1;
  return !c.causal || int64_t{n} * kBwdBlockN <= last_row + (len_k - len_q);
}

template <int kBlockM, bool kLocal = false, bool kHeadSplits = false>
void check_order(const Case& c) {
  constexpr bool kRows = kBlockM == 2 * kBwdTileRows;  // a group per q tile of the step
  const int32_t batch = static_cast<int32_t>(c.lq.size());
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int32_t b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + c.lq[b]);
    cu_k.push_back(cu_k.back() + c.lk[b]);
  }
  // The work list as build_bwd_work_list writes it for sequences it does not pack into shared
  // tiles (SharedTileItems below): each sequence's K tiles, ascending.
  std::vector<BwdListEntry> work;
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t tiles = (c.lk[b] + kBwdBlockN - 1) / kBwdBlockN;
    for (int32_t t = 0; t < tiles; ++t) work.push_back(BwdListEntry{b, t, tiles});
  }
  jfa::sm90::BwdLocalArgs local{};
  BwdArgs& a = local;  // the local decode reads the window behind it
  a.cu_q = cu_q.data();
  a.cu_k = cu_k.data();
  a.work = work.data();
  a.batch = batch;
  a.total_q = cu_q.back();
  a.total_k = cu_k.back();
  a.heads_kv = c.heads_kv;
  a.group = c.group;
  a.heads_q = c.heads_kv * c.group;
  a.head_splits = c.splits;
  a.item_heads = c.group / c.splits;
  a.causal = !kLocal && c.causal ? 1 : 0;
  a.deterministic = c.deterministic ? 1 : 0;
  local.window = c.window;

  std::set<std::tuple<int32_t, int32_t, int32_t>> items;  // (b, first query head, K tile)
  std::map<std::tuple<int32_t, int32_t, int32_t>, std::vector<Add>> adds;  // (b, head, q tile)
  ASSERT_TRUE(kHeadSplits || c.splits == 1) << "the plain kernels' decode takes no splits";
  const int64_t n_items = static_cast<int64_t>(work.size()) * c.heads_kv * c.splits;
  for (int64_t item = 0; item < n_items; ++item) {
    const BwdItem w = jfa::sm90::decode_bwd_item<kBlockM, kBwdBlockN, kLocal, kHeadSplits>(a, item);
    const int32_t b = work[item / (c.heads_kv * c.splits)].seq;
    const int32_t head0 = jfa::sm90::item_first_q_head<kHeadSplits>(a, w);
    const int32_t heads = jfa::sm90::item_heads<kHeadSplits>(a);
    ASSERT_TRUE(w.valid);
    ASSERT_EQ(heads, c.group / c.splits);
    ASSERT_EQ(head0 % heads, 0) << "an item's heads are one slice of a group";
    ASSERT_EQ(jfa::sm90::item_kv_head<kHeadSplits>(a, w), head0 / c.group)
        << "the slice's query heads share the kv head";
    ASSERT_TRUE(items.insert({b, head0, w.n_block}).second)
        << "item " << item << " repeats sequence " << b << " heads from " << head0 << " K tile "
        << w.n_block;
    ASSERT_EQ(w.seq.len_q, c.lq[b]);
    ASSERT_EQ(w.seq.len_k, c.lk[b]);
    // The walk: each step of [m_first, m_end) once, for each query head of the item.
    std::vector<int32_t> steps;
    for (int32_t i = 0; i < w.q_tiles(); ++i)
      steps.push_back(jfa::sm90::walk_q_tile<kLocal>(a, w, i));
    std::vector<int32_t> sorted = steps;
    std::sort(sorted.begin(), sorted.end());
    for (int32_t i = 0; i < w.q_tiles(); ++i) ASSERT_EQ(sorted[i], w.m_first + i);
    for (int32_t g = 0; g < heads; ++g)
      for (int32_t m : steps)
        for (int32_t part = 0; part < (kRows ? 2 : 1); ++part) {
          const jfa::sm90::DqAdd add =
              jfa::sm90::dq_add_of_step<kBlockM, kBwdBlockN, kLocal>(a, w, m, part);
          const int32_t q_tile = add.q_tile, rows = add.rows, rank = add.rank;
          ASSERT_EQ(q_tile, m * (kBlockM / kBwdTileRows) + part);
          // Rows: those of the q tile inside the sequence, none where a two-tile step's q tile
          // sees no key of the item (under the causal mask or a window); a one-tile step's q
          // tile always sees one.
          const bool item_seen = sees<kLocal>(c, c.lq[b], c.lk[b], q_tile, w.n_block);
          if (!kRows && w.seq.len_q > 0) ASSERT_TRUE(item_seen) << "a step without the item's keys";
          ASSERT_EQ(rows,
                    kRows && !item_seen
                        ? 0
                        : std::max(0, std::min(kBwdTileRows, w.seq.len_q - q_tile * kBwdTileRows)));
          if (rows > 0) adds[{b, head0 + g, q_tile}].push_back(Add{rank, item, w.n_block});
        }
  }
  // Every K tile of every sequence and slice of every kv head's query heads is an item.
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t h = 0; h < c.heads_kv * c.group; h += a.item_heads)
      for (int32_t n = 0; n * kBwdBlockN < c.lk[b]; ++n)
        ASSERT_TRUE(items.count({b, h, n}))
            << "sequence " << b << " heads from " << h << " K tile " << n << " missing";
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t h = 0; h < c.heads_kv * c.group; ++h)
      for (int32_t t = 0; t * kBwdTileRows < c.lq[b]; ++t) {
        const auto it = adds.find({b, h, t});
        std::vector<Add> got = it == adds.end() ? std::vector<Add>{} : it->second;
        std::set<int32_t> adders, expected;
        for (const Add& x : got) adders.insert(x.n_block);
        for (int32_t n = 0; n * kBwdBlockN < c.lk[b]; ++n)
          if (sees<kLocal>(c, c.lq[b], c.lk[b], t, n)) expected.insert(n);
        ASSERT_EQ(adders, expected) << "sequence " << b << " head " << h << " q tile " << t;
        ASSERT_EQ(adders.size(), got.size()) << "a K tile adds twice to q tile " << t;
        if (!c.deterministic) continue;
        std::sort(got.begin(), got.end(),
                  [](const Add& x, const Add& y) { return x.rank < y.rank; });
        for (size_t r = 0; r < got.size(); ++r) {
          ASSERT_EQ(got[r].rank, static_cast<int32_t>(r))
              << "sequence " << b << " head " << h << " q tile " << t << ": ranks not 0 .. n - 1";
          if (r > 0)
            ASSERT_LT(got[r - 1].claimed, got[r].claimed)
                << "q tile " << t << ": the add of rank " << r << " waits for an item claimed "
                << "after it";
        }
      }
}

// The plain decode where the case has no head splits (and the head-split kernels' decode of one
// slice a kv head, which must agree), else the head-split kernels'.
template <int kBlockM>
void check_order_of_kernels(const Case& c) {
  if (c.splits == 1) ASSERT_NO_FATAL_FAILURE((check_order<kBlockM, false, false>(c)));
  ASSERT_NO_FATAL_FAILURE((check_order<kBlockM, false, true>(c)));
}

int32_t draw_length(std::mt19937_64& rng) {
  static const int32_t kEdges[] = {0, 1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257};
  if (rng() % 2) return kEdges[rng() % (sizeof(kEdges) / sizeof(kEdges[0]))];
  return static_cast<int32_t>(rng() % 700);
}

Case draw_case(std::mt19937_64& rng) {
  Case c;
  const int batch = 1 + static_cast<int>(rng() % 6);
  for (int b = 0; b < batch; ++b) {
    c.lq.push_back(draw_length(rng));
    c.lk.push_back(rng() % 3 == 0 ? draw_length(rng) : c.lq.back());
  }
  c.heads_kv = 1 + static_cast<int32_t>(rng() % 2);
  static const int32_t kGroups[] = {1, 2, 4, 6};
  c.group = kGroups[rng() % 4];
  do {  // a divisor of the group
    c.splits = 1 + static_cast<int32_t>(rng() % c.group);
  } while (c.group % c.splits != 0);
  c.causal = rng() % 2;
  c.deterministic = rng() % 4 != 0;
  return c;
}

// A window of either side or both, edge sizes (0, 1, a tile and around it) and longer ones, with
// the causal mask (right 0) or not; sometimes no window at all (sinks or softcap alone). No head
// splits: the local kernels take none.
Case draw_local_case(std::mt19937_64& rng) {
  Case c = draw_case(rng);
  c.splits = 1;
  static const int32_t kSides[] = {-1, 0, 1, 63, 64, 65, 127, 128, 129, 300};
  auto side = [&] { return kSides[rng() % (sizeof(kSides) / sizeof(kSides[0]))]; };
  c.window = jfa::detail::resolve_window(c.causal, side(), side());
  return c;
}

TEST(BackwardOrder, LocalAttention) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (int i = 0; i < 600; ++i) {
    const Case c = draw_local_case(rng);
    SCOPED_TRACE(testing::Message() << "window (" << c.window.left << ", " << c.window.right
                                    << ") deterministic " << c.deterministic);
    ASSERT_NO_FATAL_FAILURE((check_order<kBwdTileRows, true>(c)));
    ASSERT_NO_FATAL_FAILURE((check_order<2 * kBwdTileRows, true>(c)));
  }
}

TEST(BackwardOrder, OneTileSteps) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (int i = 0; i < 400; ++i)
    ASSERT_NO_FATAL_FAILURE(check_order_of_kernels<kBwdTileRows>(draw_case(rng)));
}

TEST(BackwardOrder, TwoTileSteps) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (int i = 0; i < 400; ++i)
    ASSERT_NO_FATAL_FAILURE(check_order_of_kernels<2 * kBwdTileRows>(draw_case(rng)));
}

// Queries longer than the keys under the causal mask: a two-tile step's first q tile can lie
// above every key (it must add nothing), and K tiles every row sees (keys longer than queries).
TEST(BackwardOrder, CausalCrossLengthsAtTheEdges) {
  for (bool deterministic : {true, false})
    for (int32_t lq : {1, 64, 65, 130, 200, 300})
      for (int32_t lk : {1, 63, 100, 128, 129, 400}) {
        Case c;
        c.lq = {lq, 37};
        c.lk = {lk, 37};
        c.causal = true;
        c.deterministic = deterministic;
        ASSERT_NO_FATAL_FAILURE(check_order<kBwdTileRows>(c));
        ASSERT_NO_FATAL_FAILURE(check_order<2 * kBwdTileRows>(c));
      }
}

// A tile shared by short sequences (one list entry for sequences 1 .. 4): per kv head one item over
// their keys together (n_block 0, from the first row, whatever the mask), whose steps add every
// row of theirs to dQ exactly once, with rank 0 (no other item adds to those rows). An entry that
// claims more sequences than the batch holds, or more rows than a shared tile, is clamped.
template <int kBlockM>
void check_shared_tile(bool causal, bool deterministic) {
  const std::vector<int32_t> lq{200, 3, 0, 50, 90}, lk{130, 3, 9, 50, 60};
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (size_t b = 0; b < lq.size(); ++b) {
    cu_q.push_back(cu_q.back() + lq[b]);
    cu_k.push_back(cu_k.back() + lk[b]);
  }
  for (int32_t n_seqs : {4, 9}) {
    const std::vector<BwdListEntry> work{{1, 0, 1, n_seqs}};
    BwdArgs a{};
    a.cu_q = cu_q.data();
    a.cu_k = cu_k.data();
    a.work = work.data();
    a.batch = static_cast<int64_t>(lq.size());
    a.total_q = cu_q.back();
    a.total_k = cu_k.back();
    a.heads_kv = 2;
    a.group = 1;
    a.heads_q = 2;
    a.head_splits = 1;
    a.item_heads = 1;
    a.causal = causal ? 1 : 0;
    a.deterministic = deterministic ? 1 : 0;
    for (int64_t item = 0; item < a.heads_kv; ++item) {
      const BwdItem w = jfa::sm90::decode_bwd_item<kBlockM>(a, item);
      EXPECT_EQ(w.n_seqs, 4) << "sequences 1 .. 4 are all the batch has after the first";
      EXPECT_EQ(w.first_seq, 1);
      EXPECT_EQ(w.kv_head, item);
      EXPECT_EQ(w.n_block, 0);
      EXPECT_EQ(w.seq.q_start, 200);
      EXPECT_EQ(w.seq.len_q, jfa::sm90::kBwdPackRows) << "143 rows, clamped to a shared tile";
      EXPECT_EQ(w.seq.k_start, 130);
      EXPECT_EQ(w.seq.len_k, 122);
      EXPECT_EQ(w.m_first, 0);
      EXPECT_EQ(w.m_end, (w.seq.len_q + kBlockM - 1) / kBlockM);
      std::vector<int> added(static_cast<size_t>(w.seq.len_q), 0);
      for (int32_t i = 0; i < w.q_tiles(); ++i) {
        const int32_t m = jfa::sm90::walk_q_tile(a, w, i);
        for (int group = 0; group < 2; ++group) {
          const auto add = jfa::sm90::dq_add_of_step<kBlockM>(a, w, m, group);
          EXPECT_EQ(add.rank, 0);
          // With one q tile per step both groups add to it (halves of the columns or of the
          // keys); with two, each group its own.
          if (kBlockM == kBwdTileRows && group == 1) continue;
          for (int32_t r = 0; r < add.rows; ++r) {
            const int64_t row = int64_t{add.q_tile} * kBwdTileRows + r;
            ASSERT_LT(row, w.seq.len_q);
            ++added[static_cast<size_t>(row)];
          }
        }
      }
      for (int32_t r = 0; r < w.seq.len_q; ++r) EXPECT_EQ(added[static_cast<size_t>(r)], 1) << r;
    }
  }
}

TEST(BackwardOrder, SharedTileItems) {
  for (bool causal : {false, true})
    for (bool deterministic : {false, true}) {
      check_shared_tile<kBwdTileRows>(causal, deterministic);
      check_shared_tile<2 * kBwdTileRows>(causal, deterministic);
    }
}

}  // namespace
