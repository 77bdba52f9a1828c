// Host jagged <-> padded copies (offsets validated by the caller).
#pragma once

#include <cstdint>

#include "jfa/jfa.h"

namespace jfa::detail {

void jagged_to_padded_cpu(const void* jagged, const int32_t* offsets, int64_t batch,
                          int64_t row_elems, jfa_dtype dtype, int32_t max_length,
                          double padding_value, void* padded);

void padded_to_jagged_cpu(const void* padded, const int32_t* offsets, int64_t batch,
                          int64_t row_elems, jfa_dtype dtype, int32_t max_length, void* jagged);

}  // namespace jfa::detail
