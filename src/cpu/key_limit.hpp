// The keys a query row sees: all of its sequence's, or under the causal mask (bottom-right aligned)
// those up to its diagonal.
#pragma once

#include <algorithm>
#include <cstdint>

namespace jfa::detail {

// Visible keys of query row i of a sequence of len_q queries and len_k keys: [0, key_limit).
inline int64_t key_limit(bool causal, int64_t i, int64_t len_q, int64_t len_k) {
  if (!causal) return len_k;
  return std::clamp<int64_t>(i + (len_k - len_q) + 1, 0, len_k);
}

}  // namespace jfa::detail
