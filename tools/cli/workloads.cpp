#include "cli/workloads.hpp"

#include <cctype>
#include <random>

#include "cli/args.hpp"
#include "cli/format.hpp"

namespace jfa::cli {
namespace {

struct Preset {
  const char* id;
  const char* description;
  std::vector<int32_t> (*lengths)();
};

std::vector<int32_t> w1_lengths() { return uniform_lengths(32, {1024, 3072}, kW1LengthSeed); }
std::vector<int32_t> w2_lengths() { return {128, 4096, 512, 2048}; }
std::vector<int32_t> w3_lengths() { return uniform_lengths(16, {1, 8192}, kW3LengthSeed); }
std::vector<int32_t> w4_lengths() { return uniform_lengths(4096, {1, 64}, kW4LengthSeed); }

const Preset kPresets[] = {
    {"W1", "B=32, lengths uniform in [1024, 3072] (mean 2048 +- 50%): the benchmark batch",
     w1_lengths},
    {"W2", "lengths [128, 4096, 512, 2048]: the worked example", w2_lengths},
    {"W3", "B=16, lengths uniform in [1, 8192]: packed LLM prefill", w3_lengths},
    {"W4", "B=4096, lengths uniform in [1, 64]: many tiny sequences", w4_lengths},
};

}  // namespace

std::vector<int32_t> uniform_lengths(int64_t batch, UniformDist dist, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const uint64_t span = static_cast<uint64_t>(dist.hi) - static_cast<uint64_t>(dist.lo) + 1;
  // Rejection sampling: draws at or above `limit` would favour small remainders.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  std::vector<int32_t> lengths(static_cast<size_t>(batch));
  for (int32_t& length : lengths) {
    uint64_t x = rng();
    while (x >= limit) x = rng();
    length = static_cast<int32_t>(dist.lo + static_cast<int64_t>(x % span));
  }
  return lengths;
}

UniformDist parse_dist(std::string_view text) {
  constexpr std::string_view kPrefix = "uniform:";
  if (text.substr(0, kPrefix.size()) != kPrefix) {
    throw BadValue(strprintf("expected uniform:LO:HI, got '%.*s'", static_cast<int>(text.size()),
                             text.data()));
  }
  const std::string_view rest = text.substr(kPrefix.size());
  const size_t colon = rest.find(':');
  if (colon == std::string_view::npos) {
    throw BadValue(strprintf("expected uniform:LO:HI, got '%.*s'", static_cast<int>(text.size()),
                             text.data()));
  }
  constexpr int64_t kMax = INT32_MAX;
  UniformDist d;
  d.lo = static_cast<int32_t>(parse_int(rest.substr(0, colon), 0, kMax));
  d.hi = static_cast<int32_t>(parse_int(rest.substr(colon + 1), 0, kMax));
  if (d.lo > d.hi) throw BadValue(strprintf("LO=%d is greater than HI=%d", d.lo, d.hi));
  return d;
}

std::optional<Workload> preset_workload(std::string_view id) {
  for (const Preset& p : kPresets) {
    const std::string_view name = p.id;
    if (id.size() == name.size() && std::toupper(static_cast<unsigned char>(id[0])) == name[0] &&
        id.substr(1) == name.substr(1)) {
      std::vector<int32_t> lengths = p.lengths();
      return Workload{std::string(name), std::string(p.description), lengths, lengths, kDataSeed};
    }
  }
  return std::nullopt;
}

std::string preset_help() {
  std::string out;
  for (const Preset& p : kPresets) out += strprintf("  %s  %s\n", p.id, p.description);
  return out;
}

std::vector<int32_t> scale_lengths(const std::vector<int32_t>& lengths, int32_t divisor) {
  std::vector<int32_t> out(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i)
    out[i] = static_cast<int32_t>((static_cast<int64_t>(lengths[i]) + divisor - 1) / divisor);
  return out;
}

}  // namespace jfa::cli
