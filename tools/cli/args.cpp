#include "cli/args.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "cli/format.hpp"

namespace jfa::cli {

ArgParser::ArgParser(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void ArgParser::add_flag(std::string name, std::string help, bool* target) {
  options_.push_back(
      {std::move(name), "", std::move(help), [target](std::string_view) { *target = true; }});
}

void ArgParser::add_option(std::string name, std::string metavar, std::string help,
                           std::function<void(std::string_view)> apply) {
  options_.push_back({std::move(name), std::move(metavar), std::move(help), std::move(apply)});
}

void ArgParser::add_int(std::string name, std::string metavar, std::string help, int* target,
                        int lo, int hi) {
  add_option(
      std::move(name), std::move(metavar), std::move(help),
      [target, lo, hi](std::string_view v) { *target = static_cast<int>(parse_int(v, lo, hi)); });
}

void ArgParser::add_uint64(std::string name, std::string metavar, std::string help,
                           uint64_t* target) {
  add_option(std::move(name), std::move(metavar), std::move(help),
             [target](std::string_view v) { *target = parse_uint64(v); });
}

void ArgParser::add_backend(BackendChoice* target) {
  add_option("--backend", "auto|cpu|cuda",
             "where to run: cuda when a supported GPU is available (auto, the default), else the "
             "multithreaded CPU path",
             [target](std::string_view v) { *target = parse_backend(v); });
}

void ArgParser::add_dtype(std::string help, DType* target) {
  add_option("--dtype", "fp16|bf16|fp32", std::move(help),
             [target](std::string_view v) { *target = parse_dtype(v); });
}

ArgParser::Option* ArgParser::find(std::string_view name) {
  for (Option& o : options_)
    if (o.name == name) return &o;
  return nullptr;
}

const ArgParser::Option* ArgParser::find(std::string_view name) const {
  for (const Option& o : options_)
    if (o.name == name) return &o;
  return nullptr;
}

bool ArgParser::given(std::string_view name) const {
  const Option* o = find(name);
  return o != nullptr && o->seen;
}

bool ArgParser::parse(std::span<const std::string> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      throw UsageError(strprintf("unexpected argument '%s' (options start with --)", arg.c_str()));
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    Option* option = find(name);
    if (option == nullptr) throw UsageError(strprintf("unknown option '%s'", name.c_str()));
    if (option->seen) throw UsageError(strprintf("%s given more than once", name.c_str()));
    option->seen = true;
    std::string value;
    if (option->metavar.empty()) {
      if (eq != std::string::npos)
        throw UsageError(strprintf("%s takes no value, got '%s'", name.c_str(), arg.c_str()));
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw UsageError(strprintf("%s needs a value (%s)", name.c_str(), option->metavar.c_str()));
    }
    try {
      option->apply(value);
    } catch (const BadValue& e) {
      throw UsageError(strprintf("%s: %s", name.c_str(), e.what()));
    }
  }
  return true;
}

std::string ArgParser::help() const {
  std::string out = strprintf("usage: %s [options]\n\n%s\n", program_.c_str(), summary_.c_str());
  if (!options_.empty()) out += "\noptions:\n";
  for (const Option& o : options_) {
    std::string left = "  " + o.name;
    if (!o.metavar.empty()) left += " " + o.metavar;
    constexpr size_t kColumn = 28;
    if (left.size() + 2 > kColumn) {
      out += left + "\n" + std::string(kColumn, ' ');
    } else {
      out += left + std::string(kColumn - left.size(), ' ');
    }
    // Wrap the help text at 100 columns, continuation lines indented to the column.
    size_t col = kColumn;
    std::string_view text = o.help;
    while (!text.empty()) {
      const size_t space = text.find(' ');
      const std::string_view word = text.substr(0, space);
      if (col > kColumn && col + 1 + word.size() > 100) {
        out += "\n" + std::string(kColumn, ' ');
        col = kColumn;
      } else if (col > kColumn) {
        out += ' ';
        ++col;
      }
      out += word;
      col += word.size();
      text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
    }
    out += "\n";
  }
  out += "  --help                    print this help and exit\n";
  if (!epilog_.empty()) out += "\n" + epilog_;
  if (out.back() != '\n') out += '\n';
  return out;
}

int64_t parse_int(std::string_view text, int64_t lo, int64_t hi) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw BadValue(strprintf("expected an integer in [%lld, %lld], got '%.*s'",
                             static_cast<long long>(lo), static_cast<long long>(hi),
                             static_cast<int>(text.size()), text.data()));
  }
  if (value < lo || value > hi) {
    throw BadValue(strprintf("%lld is outside [%lld, %lld]", static_cast<long long>(value),
                             static_cast<long long>(lo), static_cast<long long>(hi)));
  }
  return value;
}

uint64_t parse_uint64(std::string_view text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  int base = 10;
  const char* begin = text.data();
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    begin += 2;
  }
  const auto [ptr, ec] = std::from_chars(begin, end, value, base);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw BadValue(strprintf("expected a non-negative integer (decimal or 0x hex), got '%.*s'",
                             static_cast<int>(text.size()), text.data()));
  }
  return value;
}

std::vector<int32_t> parse_int_list(std::string_view text, int32_t lo, int32_t hi) {
  std::vector<int32_t> values;
  if (text.empty()) throw BadValue("expected a comma-separated list of integers, got ''");
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    try {
      values.push_back(static_cast<int32_t>(parse_int(item, lo, hi)));
    } catch (const BadValue& e) {
      throw BadValue(strprintf("entry %zu: %s", values.size(), e.what()));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return values;
}

double parse_double(std::string_view text, double lo, double hi) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) {
    throw BadValue(strprintf("expected a number in [%g, %g], got '%.*s'", lo, hi,
                             static_cast<int>(text.size()), text.data()));
  }
  if (value < lo || value > hi) throw BadValue(strprintf("%g is outside [%g, %g]", value, lo, hi));
  return value;
}

std::pair<int32_t, int32_t> parse_window(std::string_view text) {
  const std::vector<int32_t> sides = parse_int_list(text, -1, std::numeric_limits<int32_t>::max());
  if (sides.size() != 2)
    throw BadValue(strprintf("expected LEFT,RIGHT (each >= 0, or -1 for unbounded), got '%.*s'",
                             static_cast<int>(text.size()), text.data()));
  return {sides[0], sides[1]};
}

DType parse_dtype(std::string_view text) {
  if (text == "fp16" || text == "float16" || text == "half") return DType::kFloat16;
  if (text == "bf16" || text == "bfloat16") return DType::kBFloat16;
  if (text == "fp32" || text == "float32" || text == "float") return DType::kFloat32;
  throw BadValue(strprintf("expected fp16, bf16 or fp32, got '%.*s'", static_cast<int>(text.size()),
                           text.data()));
}

BackendChoice parse_backend(std::string_view text) {
  if (text == "auto") return BackendChoice::kAuto;
  if (text == "cpu") return BackendChoice::kCpu;
  if (text == "cuda" || text == "gpu") return BackendChoice::kCuda;
  throw BadValue(strprintf("expected auto, cpu or cuda, got '%.*s'", static_cast<int>(text.size()),
                           text.data()));
}

const char* backend_choice_name(BackendChoice choice) {
  switch (choice) {
    case BackendChoice::kCpu:
      return "cpu";
    case BackendChoice::kCuda:
      return "cuda";
    default:
      return "auto";
  }
}

}  // namespace jfa::cli
