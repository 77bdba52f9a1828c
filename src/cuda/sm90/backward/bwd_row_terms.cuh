// Where a backward step finds the LSE and D rows of its query tokens in the row-terms array
// (bwd_workspace.hpp), for the producer's TMA load and the consumers' reads.
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/bwd_config.cuh"

namespace jfa::sm90 {

// Where a step's LSE and D rows come from (bwd_workspace.hpp): the first column, on a 16-byte
// boundary as TMA needs, the first row of the array (0, or the shifted copy's when the step's
// first token is odd), and where in the loaded stage the step's first token lies (0 or 2 floats:
// the consumers read pairs on 8 bytes).
struct RowTermsAt {
  int32_t col, row, first;
};

__device__ __forceinline__ RowTermsAt row_terms_at(int32_t first_token, int32_t heads_q) {
  const int32_t odd = first_token & 1, col = first_token + odd;
  return RowTermsAt{col & ~3, odd * kShiftedRowTerms * heads_q, col & 3};
}

}  // namespace jfa::sm90
