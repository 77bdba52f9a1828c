// Entry-point guard of the C ABI: no exception crosses it. The status and message helpers live in
// common/status.hpp.
#pragma once

#include "common/status.hpp"

namespace jfa::detail {

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
