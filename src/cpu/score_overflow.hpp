// A score the float32 CPU paths cannot represent: scale * q.k beyond float32's range (or an input
// that is not finite). The paths throw it from a worker; the entry point turns it into a status,
// so that no NaN comes back with a success.
#pragma once

#include <stdexcept>

#include "common/status.hpp"

namespace jfa::detail {

struct ScoreOverflow : std::runtime_error {
  ScoreOverflow() : std::runtime_error("score overflow") {}
};

inline jfa_status score_overflow_status() {
  return fail(JFA_ERROR_UNSUPPORTED,
              "a scaled score softmax_scale * q.k is not finite in float32 (|score| above "
              "3.4e38, or an input that is NaN or infinite); the outputs are unspecified: scale "
              "the inputs or softmax_scale down");
}

}  // namespace jfa::detail
