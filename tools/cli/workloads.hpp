// The benchmark workloads (W1-W4) and the length generators behind them. Every seed
// lives here, so every run of a workload measures the same batch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jfa::cli {

// Lengths of a jagged batch and the seed of its Q/K/V values.
struct Workload {
  std::string name;         // "W1", "custom", "uniform:1024:3072", ...
  std::string description;  // one line for humans
  std::vector<int32_t> lengths_q;
  std::vector<int32_t> lengths_k;  // equal to lengths_q for self-attention
  uint64_t data_seed = 0;          // seeds the random normal Q, K, V
};

// Seeds of the presets (fixed: changing one changes every published number of that workload).
inline constexpr uint64_t kW1LengthSeed = 0x5EED0001;
inline constexpr uint64_t kW3LengthSeed = 0x5EED0003;
inline constexpr uint64_t kW4LengthSeed = 0x5EED0004;
inline constexpr uint64_t kDataSeed = 0xDA7A5EED;
// Default seed of `--dist` batches.
inline constexpr uint64_t kDefaultDistSeed = 1;

// A uniform integer length distribution U[lo, hi].
struct UniformDist {
  int32_t lo = 0;
  int32_t hi = 0;
};

// `batch` lengths drawn from U[lo, hi] with a 64-bit Mersenne twister seeded with `seed`. The
// mapping to the range is done here (not by std::uniform_int_distribution, whose output differs
// between standard libraries), so a seed gives the same lengths everywhere.
std::vector<int32_t> uniform_lengths(int64_t batch, UniformDist dist, uint64_t seed);

// "uniform:LO:HI" -> {LO, HI}; throws BadValue when malformed or when LO > HI or LO < 0.
UniformDist parse_dist(std::string_view text);

// The preset named id ("W1".."W4", case-insensitive), or nothing.
std::optional<Workload> preset_workload(std::string_view id);
// "W1, W2, W3, W4" with their descriptions, one per line, for --help.
std::string preset_help();

// Lengths divided by `divisor`, rounded up, so a scaled batch keeps the shape of the original and
// no sequence becomes empty that was not.
std::vector<int32_t> scale_lengths(const std::vector<int32_t>& lengths, int32_t divisor);

}  // namespace jfa::cli
