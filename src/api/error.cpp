#include "api/error.hpp"

#include "api/enum_bits.hpp"

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
