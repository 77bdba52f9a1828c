// The commands of `jfa`. Each takes the arguments after its name and returns the exit status;
// UsageError (status 2) and jfa::Error (status 1) propagate to main().
#pragma once

#include <span>
#include <string>

namespace jfa::cli {

int demo_main(std::span<const std::string> args);
int bench_main(std::span<const std::string> args);
int check_main(std::span<const std::string> args);

}  // namespace jfa::cli
