// jfa: the command-line tool of the jagged flash attention library.
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/runner.hpp"
#include "jfa/jfa.hpp"

namespace jfa::cli {
namespace {

constexpr const char* kUsage =
    "usage: jfa <command> [options]\n"
    "\n"
    "Jagged flash attention: attention over variable-length sequences packed end to end, with\n"
    "no padding.\n"
    "\n"
    "commands:\n"
    "  demo     the reference problems, jagged against padded, timed and checked\n"
    "  bench    time jagged (and padded) attention on a workload, as a table or JSON lines\n"
    "  check    random and edge-case problems against the float64 reference\n"
    "  help     help on a command: jfa help <command> (or jfa <command> --help)\n"
    "\n"
    "options:\n"
    "  --help       print this help and exit\n"
    "  --version    print the versions and the available backends\n"
    "\n"
    "exit status: 0 success, 1 a failed check or a library error, 2 a bad command line\n"
    "environment: JFA_NUM_THREADS caps the threads of the CPU backend\n";

void print_version() {
  std::printf("jfa %s (library %s)\n", JFA_VERSION_STRING, version().c_str());
  std::printf("cpu backend: yes, %d threads\n", cpu_threads());
#ifdef JFA_WITH_CUDA
  std::printf("cuda backend: built; GPU %s\n",
              cuda_available() ? "available" : "not available (jfa_cuda_available() = 0)");
#else
  std::printf("cuda backend: not built into this tool\n");
#endif
}

using CommandMain = int (*)(std::span<const std::string>);

CommandMain find_command(const std::string& name) {
  if (name == "demo") return demo_main;
  if (name == "bench") return bench_main;
  if (name == "check") return check_main;
  throw UsageError("unknown command '" + name + "' (commands: demo, bench, check)");
}

int main_impl(const std::vector<std::string>& args) {
  std::string program = "jfa";
  try {
    if (args.empty()) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    const std::string& first = args[0];
    if (first == "--help" || first == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (first == "--version") {
      print_version();
      return 0;
    }
    if (first == "help") {
      if (args.size() == 1) {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (args.size() > 2) throw UsageError("help takes one command name");
      const CommandMain command = find_command(args[1]);
      program = "jfa " + args[1];
      const std::vector<std::string> help = {"--help"};
      return command(help);
    }
    if (first.starts_with("-")) throw UsageError("unknown option '" + first + "'");
    const CommandMain command = find_command(first);
    program = "jfa " + first;
    return command(std::span<const std::string>(args).subspan(1));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n(see '%s --help')\n", program.c_str(), e.what(),
                 program.c_str());
    return 2;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: out of host memory\n", program.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: internal error: %s\n", program.c_str(), e.what());
    return 1;
  }
}

}  // namespace
}  // namespace jfa::cli

int main(int argc, char** argv) {
  return jfa::cli::main_impl(std::vector<std::string>(argv + 1, argv + argc));
}
