// The Hopper kernels' one table of shapes (src/cuda/sm90/shapes.def): the head sizes each pass
// serves come from its rows, in their order, each once (host/head_sizes.hpp), and every row is a
// shape the dispatch can pick (its head size is among those served).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/sm90/host/head_sizes.hpp"

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

}  // namespace
