// The last error of each thread, and the helper that sets it: every layer (API, CPU and CUDA
// backends) reports a failure as a status plus a message that names the argument and the rule
// broken.
#pragma once

#include <string>

#include "jfa/jfa.h"

namespace jfa::detail {

// Records a printf-style message for this thread and returns the status, so callers can write
// `return fail(JFA_ERROR_INVALID_ARGUMENT, "head_dim must be > 0, got %d", d);`.
jfa_status fail(jfa_status status, const char* format, ...) __attribute__((format(printf, 2, 3)));

void clear_error();
const std::string& last_error_message();

}  // namespace jfa::detail
