// The last error of each thread, and the helpers that set it. Every public entry reports failure
// through these so that the message always names the argument and the rule broken.
#pragma once

#include <string>

#include "jfa/jfa.h"

namespace jfa::detail {

// Records a printf-style message for this thread and returns the status, so callers can write
// `return fail(JFA_ERROR_INVALID_ARGUMENT, "head_dim must be > 0, got %d", d);`.
jfa_status fail(jfa_status status, const char* format, ...) __attribute__((format(printf, 2, 3)));

void clear_error();
const std::string& last_error_message();

// Runs a body that may throw, turning exceptions into statuses (no exception crosses the C ABI).
template <typename Body>
jfa_status guarded(Body&& body) noexcept;

}  // namespace jfa::detail

#include <exception>
#include <new>

namespace jfa::detail {

template <typename Body>
jfa_status guarded(Body&& body) noexcept {
  try {
    clear_error();
    return body();
  } catch (const std::bad_alloc&) {
    return fail(JFA_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(JFA_ERROR_INTERNAL, "internal error: %s", e.what());
  } catch (...) {
    return fail(JFA_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace jfa::detail
