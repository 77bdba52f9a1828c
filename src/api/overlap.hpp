// Buffers that a call writes must not share memory with any other buffer of the call: an output
// overlapping an input (or another output) would be read after it was written, and the result
// would depend on the order of the work. Views that interleave without sharing an element (e.g.
// slots of one fused tensor) are allowed.
#pragma once

#include <vector>

#include "api/call_buffers.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

// JFA_ERROR_INVALID_ARGUMENT naming both buffers when a written buffer shares an element with
// another one.
jfa_status check_outputs_disjoint(const std::vector<BufferView>& buffers);

}  // namespace jfa::detail
