// The Hopper kernels' one table of shapes (src/cuda/sm90/shapes.def): the head sizes each pass
// serves come from its rows, in their order, each once (host/head_sizes.hpp), and every row is a
// shape the dispatch picks for some calls (host/shape_rows.hpp).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "common/params.hpp"
#include "cuda/sm90/host/head_sizes.hpp"
#include "cuda/sm90/host/shape_rows.hpp"

namespace {

using jfa::sm90::HeadSize;

std::string names(auto const& sizes) {
  std::string s;
  for (const HeadSize& h : sizes)
    s += (s.empty() ? "" : " ") + std::to_string(h.qk) +
         (h.qk == h.v ? "" : "/" + std::to_string(h.v));
  return s;
}

TEST(Sm90Shapes, HeadSizesAreTheRowsPairsEachOnce) {
  EXPECT_EQ(names(jfa::sm90::kForwardHeadSizes), "32 64 96 128 192 192/128 256");
  EXPECT_EQ(names(jfa::sm90::kBackwardHeadSizes), "32 64 96 128 192 192/128 256");
  // Every row's pair is served, and every served pair has a row.
  for (const HeadSize& row : jfa::sm90::kForwardRows) {
    bool served = false;
    for (const HeadSize& h : jfa::sm90::kForwardHeadSizes) served |= h.qk == row.qk && h.v == row.v;
    EXPECT_TRUE(served) << row.qk << "/" << row.v;
  }
  for (const HeadSize& row : jfa::sm90::kBackwardRows) {
    bool served = false;
    for (const HeadSize& h : jfa::sm90::kBackwardHeadSizes)
      served |= h.qk == row.qk && h.v == row.v;
    EXPECT_TRUE(served) << row.qk << "/" << row.v;
  }
}

// The row a call runs (host/shape_rows.hpp), for every head size on both sides of each choice's
// threshold: mean query length <= 128 tokens (forward) and <= 64 (backward), with and without the
// causal mask.
struct Call {
  int d, dv;
  int64_t total_q;
  bool causal;
};

jfa::detail::Params params_of(const Call& c) {
  jfa::detail::Params p{};
  p.head_dim = c.d;
  p.head_dim_v = c.dv;
  p.batch = 3;
  p.total_q = c.total_q;
  p.total_k = c.total_q;
  p.causal = c.causal;
  return p;
}

std::string forward_row_name(const Call& c) {
  const int row = jfa::sm90::select_forward_shape(params_of(c));
  if (row < 0) return "none";
  const jfa::sm90::ForwardShape& s = jfa::sm90::kForwardShapes[row];
  return std::to_string(s.head_dim) + "/" + std::to_string(s.head_dim_v) + " g" +
         std::to_string(s.groups) + " n" + std::to_string(s.keys);
}

std::string backward_row_name(const Call& c) {
  const int row = jfa::sm90::select_backward_shape(params_of(c));
  if (row < 0) return "none";
  const jfa::sm90::BackwardShape& s = jfa::sm90::kBackwardShapes[row];
  return std::to_string(s.head_dim) + "/" + std::to_string(s.head_dim_v) + " m" +
         std::to_string(s.rows);
}

TEST(Sm90Shapes, ForwardRunsTheRowTheChoicesName) {
  struct Expected {
    int d, dv;
    const char* short_plain;  // mean query length 128 (3 sequences, 384 tokens), no mask
    const char* short_causal;
    const char* long_plain;  // mean length just over 128 (385 tokens)
    const char* long_causal;
  };
  const Expected expected[] = {
      {32, 32, "32/32 g2 n128", "32/32 g2 n128", "32/32 g3 n128", "32/32 g3 n128"},
      {64, 64, "64/64 g2 n128", "64/64 g2 n128", "64/64 g3 n128", "64/64 g3 n128"},
      {96, 96, "96/96 g2 n128", "96/96 g2 n128", "96/96 g2 n128", "96/96 g2 n128"},
      {128, 128, "128/128 g2 n128", "128/128 g2 n128", "128/128 g2 n160", "128/128 g2 n128"},
      {192, 192, "192/192 g2 n64", "192/192 g2 n64", "192/192 g2 n64", "192/192 g2 n64"},
      {192, 128, "192/128 g2 n64", "192/128 g2 n64", "192/128 g2 n64", "192/128 g2 n64"},
      {256, 256, "256/256 g2 n64", "256/256 g2 n64", "256/256 g2 n64", "256/256 g2 n64"},
  };
  for (const Expected& e : expected) {
    SCOPED_TRACE(std::to_string(e.d) + "/" + std::to_string(e.dv));
    EXPECT_EQ(forward_row_name({e.d, e.dv, 384, false}), e.short_plain);
    EXPECT_EQ(forward_row_name({e.d, e.dv, 384, true}), e.short_causal);
    EXPECT_EQ(forward_row_name({e.d, e.dv, 385, false}), e.long_plain);
    EXPECT_EQ(forward_row_name({e.d, e.dv, 385, true}), e.long_causal);
    EXPECT_EQ(forward_row_name({e.d, e.dv, 0, false}), e.short_plain);
    EXPECT_EQ(forward_row_name({e.d, e.dv, 1 << 20, false}), e.long_plain);
  }
  EXPECT_EQ(forward_row_name({80, 80, 385, false}), "none");
  EXPECT_EQ(forward_row_name({192, 64, 385, false}), "none");
}

// Softcap's kernels exist with two groups and 128-key tiles only (forward/choices.hpp): long
// sequences keep them, at every head size.
TEST(Sm90Shapes, SoftcapRunsTwoGroupsAnd128Keys) {
  for (const jfa::sm90::ForwardShape& shape : jfa::sm90::kForwardShapes) {
    for (const int64_t total_q : {int64_t{384}, int64_t{385}, int64_t{1} << 20}) {
      for (const bool causal : {false, true}) {
        jfa::detail::Params p = params_of({shape.head_dim, shape.head_dim_v, total_q, causal});
        p.softcap = 30.f;
        const int row = jfa::sm90::select_forward_shape(p);
        ASSERT_GE(row, 0) << shape.head_dim << "/" << shape.head_dim_v;
        EXPECT_EQ(jfa::sm90::kForwardShapes[row].groups, 2) << shape.head_dim;
        EXPECT_LE(jfa::sm90::kForwardShapes[row].keys, 128) << shape.head_dim;
      }
    }
  }
}

TEST(Sm90Shapes, BackwardRunsTheRowTheChoicesName) {
  struct Expected {
    int d, dv;
    const char* short_rows;  // mean query length 64 (3 sequences, 192 tokens)
    const char* long_rows;   // mean length just over 64 (193 tokens)
  };
  const Expected expected[] = {
      {32, 32, "32/32 m64", "32/32 m128"},      {64, 64, "64/64 m64", "64/64 m128"},
      {96, 96, "96/96 m64", "96/96 m64"},       {128, 128, "128/128 m64", "128/128 m64"},
      {192, 192, "192/192 m64", "192/192 m64"}, {192, 128, "192/128 m64", "192/128 m64"},
      {256, 256, "256/256 m64", "256/256 m64"},
  };
  for (const Expected& e : expected) {
    SCOPED_TRACE(std::to_string(e.d) + "/" + std::to_string(e.dv));
    for (bool causal : {false, true}) {
      EXPECT_EQ(backward_row_name({e.d, e.dv, 192, causal}), e.short_rows);
      EXPECT_EQ(backward_row_name({e.d, e.dv, 193, causal}), e.long_rows);
    }
    EXPECT_EQ(backward_row_name({e.d, e.dv, 0, false}), e.short_rows);
    EXPECT_EQ(backward_row_name({e.d, e.dv, 1 << 20, false}), e.long_rows);
  }
  EXPECT_EQ(backward_row_name({80, 80, 193, false}), "none");
}

// Every row is one that some call runs, and a value that a head size's rows differ in must be one
// of theirs (a missing row is reported, never replaced by another); a value they agree on is not
// asked for.
TEST(Sm90Shapes, EveryRowIsRunAndMissingRowsAreReported) {
  for (std::size_t i = 0; i < std::size(jfa::sm90::kForwardShapes); ++i) {
    const jfa::sm90::ForwardShape& s = jfa::sm90::kForwardShapes[i];
    bool run = false;
    for (int64_t total_q : {384, 385})
      for (bool causal : {false, true})
        run |= jfa::sm90::select_forward_shape(
                   params_of({s.head_dim, s.head_dim_v, total_q, causal})) == static_cast<int>(i);
    EXPECT_TRUE(run) << "forward row " << i;
  }
  for (std::size_t i = 0; i < std::size(jfa::sm90::kBackwardShapes); ++i) {
    const jfa::sm90::BackwardShape& s = jfa::sm90::kBackwardShapes[i];
    bool run = false;
    for (int64_t total_q : {192, 193})
      run |= jfa::sm90::select_backward_shape(
                 params_of({s.head_dim, s.head_dim_v, total_q, false})) == static_cast<int>(i);
    EXPECT_TRUE(run) << "backward row " << i;
  }
  EXPECT_EQ(jfa::sm90::forward_shape_row(64, 64, 4, 128), -1);
  EXPECT_EQ(jfa::sm90::forward_shape_row(128, 128, 2, 192), -1);
  EXPECT_EQ(jfa::sm90::backward_shape_row(64, 64, 192), -1);
  const int d128 = jfa::sm90::forward_shape_row(128, 128, 3, 160);
  ASSERT_GE(d128, 0);
  EXPECT_EQ(jfa::sm90::kForwardShapes[d128].groups, 2);
  const int d96 = jfa::sm90::backward_shape_row(96, 96, 128);
  ASSERT_GE(d96, 0);
  EXPECT_EQ(jfa::sm90::kBackwardShapes[d96].rows, 64);
}

}  // namespace
