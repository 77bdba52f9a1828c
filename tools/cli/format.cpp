#include "cli/format.hpp"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <vector>

namespace jfa::cli {

std::string strprintf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string out;
  if (n > 0) {
    std::vector<char> buffer(static_cast<size_t>(n) + 1);
    std::vsnprintf(buffer.data(), buffer.size(), format, args);
    out.assign(buffer.data(), static_cast<size_t>(n));
  }
  va_end(args);
  return out;
}

std::string count_of(int64_t n, const char* noun) {
  return with_commas(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string with_commas(int64_t value) {
  const bool negative = value < 0;
  std::string digits =
      std::to_string(negative ? -static_cast<uint64_t>(value) : static_cast<uint64_t>(value));
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return negative ? "-" + out : out;
}

std::string format_flops_rate(double flops_per_second) {
  struct Unit {
    double scale;
    const char* name;
  };
  static constexpr Unit kUnits[] = {
      {1e15, "PFLOP/s"}, {1e12, "TFLOP/s"}, {1e9, "GFLOP/s"}, {1e6, "MFLOP/s"}, {1e3, "kFLOP/s"}};
  if (!std::isfinite(flops_per_second)) return "n/a";
  for (const Unit& u : kUnits) {
    if (flops_per_second >= u.scale) {
      const double x = flops_per_second / u.scale;
      return strprintf(x >= 100 ? "%.0f %s" : x >= 10 ? "%.1f %s" : "%.2f %s", x, u.name);
    }
  }
  return strprintf("%.0f FLOP/s", flops_per_second);
}

std::string head_dims_string(int head_dim, int head_dim_v) {
  return head_dim_v == head_dim ? std::to_string(head_dim)
                                : std::to_string(head_dim) + "/" + std::to_string(head_dim_v);
}

std::string format_list(std::span<const int32_t> values, size_t limit) {
  std::string out = "[";
  const size_t n = values.size();
  const bool elide = n > limit && limit >= 2;
  for (size_t i = 0; i < n; ++i) {
    if (elide && i == limit / 2) {
      out += strprintf("... (%zu more) ..., ", n - limit);
      i = n - (limit - limit / 2);
    }
    out += std::to_string(values[i]);
    if (i + 1 < n) out += ", ";
  }
  return out + "]";
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += strprintf("\\u%04x", static_cast<unsigned>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

void JsonLine::key(std::string_view key) {
  if (body_.size() > 1) body_ += ", ";
  body_ += json_quote(key);
  body_ += ": ";
}

JsonLine& JsonLine::add(std::string_view k, std::string_view value) {
  key(k);
  body_ += json_quote(value);
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, double value) {
  key(k);
  body_ += std::isfinite(value) ? strprintf("%.6g", value) : "null";
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, std::span<const int32_t> values) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) body_ += ", ";
    body_ += std::to_string(values[i]);
  }
  body_ += "]";
  return *this;
}

}  // namespace jfa::cli
