// Which keys a query row sees: the one rule of the causal mask and the sliding window, shared by
// the float64 references, the CPU backend and the API's checks (and meant for the CUDA kernels).
//
// Bottom-right alignment (FlashAttention's): row i of a sequence of len_q queries and len_k keys
// sits on the diagonal key i + len_k - len_q, and sees key j iff
//   diagonal - left <= j <= diagonal + right,
// a bound of -1 being unbounded. The causal mask is right = 0 and wins over any other right bound
// (resolve_window). Host and device code alike: constexpr, no library calls.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define JFA_HOST_DEVICE __host__ __device__
#else
#define JFA_HOST_DEVICE
#endif

namespace jfa::detail {

// A resolved window: -1 unbounded, else >= 0.
struct Window {
  int32_t left = -1;
  int32_t right = -1;
};

// The window a call uses: causal forces right to 0 (whatever window_right was).
JFA_HOST_DEVICE constexpr Window resolve_window(bool causal, int32_t window_left,
                                                int32_t window_right) {
  return {window_left, causal ? 0 : window_right};
}

// The first visible key of row i, in [0, len_k].
JFA_HOST_DEVICE constexpr int64_t first_visible_key(const Window& w, int64_t i, int64_t len_q,
                                                    int64_t len_k) {
  if (w.left < 0) return 0;
  const int64_t first = i + len_k - len_q - w.left;
  return first < 0 ? 0 : (first > len_k ? len_k : first);
}

// One past the last visible key of row i, in [0, len_k].
JFA_HOST_DEVICE constexpr int64_t key_end(const Window& w, int64_t i, int64_t len_q,
                                          int64_t len_k) {
  if (w.right < 0) return len_k;
  const int64_t end = i + len_k - len_q + w.right + 1;
  return end < 0 ? 0 : (end > len_k ? len_k : end);
}

// Whether row i sees any key.
JFA_HOST_DEVICE constexpr bool sees_any_key(const Window& w, int64_t i, int64_t len_q,
                                            int64_t len_k) {
  return first_visible_key(w, i, len_q, len_k) < key_end(w, i, len_q, len_k);
}

// The number of keys row i sees.
JFA_HOST_DEVICE constexpr int64_t visible_keys(const Window& w, int64_t i, int64_t len_q,
                                               int64_t len_k) {
  const int64_t n = key_end(w, i, len_q, len_k) - first_visible_key(w, i, len_q, len_k);
  return n > 0 ? n : 0;
}

}  // namespace jfa::detail
