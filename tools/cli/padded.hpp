// The padded baseline: every sequence padded to the longest, as a framework without jagged
// support would run it.
#pragma once

#include "common/jagged_batch.hpp"

namespace jfa::cli {

// The same sequences padded with zeros to the longest q (and k) length: B sequences of Lmax_q
// queries and Lmax_k keys, offsets [0, Lmax, 2 Lmax, ...]. The padded keys are not masked, so
// the padded run does the work (and pays the time) of padding but its output differs from the
// jagged one: it is timed, never checked.
tools::JaggedBatch make_padded(const tools::JaggedBatch& jagged);

}  // namespace jfa::cli
