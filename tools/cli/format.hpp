// Text output helpers of the command-line tool: printf-style strings, human-readable numbers and
// one-line JSON objects.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace jfa::cli {

// printf into a std::string.
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// "1 run", "3 runs".
std::string count_of(int64_t n, const char* noun);

// 16384 -> "16,384".
std::string with_commas(int64_t value);

// A rate in FLOP/s with a unit that keeps 3-4 significant digits: "45.2 GFLOP/s", "612 TFLOP/s".
std::string format_flops_rate(double flops_per_second);

// The head sizes of q.k and of v: "128", or "192/128" where they differ.
std::string head_dims_string(int head_dim, int head_dim_v);

// "[128, 4096, 512, 2048]"; with more than `limit` entries the middle is elided.
std::string format_list(std::span<const int32_t> values, size_t limit = 8);

// Builds {"key": value, ...} on one line, keys in insertion order.
class JsonLine {
 public:
  JsonLine& add(std::string_view key, std::string_view value);
  JsonLine& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  JsonLine& add(std::string_view key, const std::string& value) {
    return add(key, std::string_view(value));
  }
  JsonLine& add(std::string_view key, int64_t value);
  JsonLine& add(std::string_view key, int32_t value) { return add(key, int64_t{value}); }
  JsonLine& add(std::string_view key, double value);  // non-finite values are written as null
  JsonLine& add(std::string_view key, bool value);
  JsonLine& add(std::string_view key, std::span<const int32_t> values);
  std::string str() const { return body_ + "}"; }

 private:
  void key(std::string_view key);
  std::string body_ = "{";
};

// A JSON string literal with the quotes.
std::string json_quote(std::string_view text);

}  // namespace jfa::cli
