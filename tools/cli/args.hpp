// Command-line parsing: declared flags and options per command, generated --help text, and the
// value parsers. A bad flag or value throws UsageError, which main() turns into exit status 2.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jfa/jfa.hpp"

namespace jfa::cli {

// A problem with the command line: the message names the flag (exit status 2).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A value that does not parse; ArgParser prefixes the flag's name (also exit status 2).
class BadValue : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class BackendChoice { kAuto, kCpu, kCuda };

class ArgParser {
 public:
  // program: "jfa bench"; summary: one line under the usage line.
  ArgParser(std::string program, std::string summary);

  // A boolean switch, "--name".
  void add_flag(std::string name, std::string help, bool* target);
  // An option with a value, "--name VALUE" or "--name=VALUE"; `apply` may throw BadValue.
  void add_option(std::string name, std::string metavar, std::string help,
                  std::function<void(std::string_view)> apply);
  // An integer option in [lo, hi].
  void add_int(std::string name, std::string metavar, std::string help, int* target, int lo,
               int hi);
  void add_uint64(std::string name, std::string metavar, std::string help, uint64_t* target);
  void add_backend(BackendChoice* target);
  void add_dtype(std::string help, DType* target);

  // Free text printed after the options in --help.
  void set_epilog(std::string epilog) { epilog_ = std::move(epilog); }

  // Parses the arguments after the command name. Returns false when --help was asked for (the
  // help text is then printed on stdout); throws UsageError on anything it does not accept.
  bool parse(std::span<const std::string> args);

  // Whether an option or flag appeared on the command line.
  bool given(std::string_view name) const;

  std::string help() const;
  const std::string& program() const { return program_; }

 private:
  struct Option {
    std::string name;
    std::string metavar;  // empty for a switch
    std::string help;
    std::function<void(std::string_view)> apply;
    bool seen = false;
  };
  Option* find(std::string_view name);
  const Option* find(std::string_view name) const;

  std::string program_, summary_, epilog_;
  std::vector<Option> options_;
};

// ---- Value parsers (throw BadValue with a message that does not name the flag) ----------------

int64_t parse_int(std::string_view text, int64_t lo, int64_t hi);
uint64_t parse_uint64(std::string_view text);
// "128,4096,512,2048" (empty entries are an error; each in [lo, hi]).
std::vector<int32_t> parse_int_list(std::string_view text, int32_t lo, int32_t hi);
// A finite number in [lo, hi].
double parse_double(std::string_view text, double lo, double hi);
// "L,R": a local attention window, each side >= 0 or -1 for unbounded.
std::pair<int32_t, int32_t> parse_window(std::string_view text);
DType parse_dtype(std::string_view text);
BackendChoice parse_backend(std::string_view text);

const char* backend_choice_name(BackendChoice choice);

}  // namespace jfa::cli
