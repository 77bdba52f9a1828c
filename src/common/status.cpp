#include "common/status.hpp"

#include <cstdarg>
#include <cstdio>

namespace jfa::detail {
namespace {
thread_local std::string last_error;
}

jfa_status fail(jfa_status status, const char* format, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  last_error = buffer;
  return status;
}

void clear_error() { last_error.clear(); }

const std::string& last_error_message() { return last_error; }

}  // namespace jfa::detail
