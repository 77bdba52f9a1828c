#include "api/error.hpp"

#include <cstdarg>
#include <cstdio>

#include "api/enum_bits.hpp"

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

extern "C" const char* jfa_last_error_message(void) {
  return jfa::detail::last_error_message().c_str();
}

extern "C" const char* jfa_status_string(jfa_status status) {
  switch (jfa::detail::enum_bits(status)) {
    case JFA_SUCCESS:
      return "success";
    case JFA_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case JFA_ERROR_UNSUPPORTED:
      return "unsupported";
    case JFA_ERROR_BACKEND_UNAVAILABLE:
      return "backend unavailable";
    case JFA_ERROR_CUDA:
      return "CUDA error";
    case JFA_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case JFA_ERROR_INTERNAL:
      return "internal error";
    default:
      break;
  }
  return "unknown status";
}
