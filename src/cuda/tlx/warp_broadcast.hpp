// A trivially copyable value as one lane of the warp holds it, in every lane: one shuffle per
// 32-bit word. Besides moving data, it lets the compiler prove a value warp-uniform (values that
// every lane computed alike already), so that what is derived from it can live in uniform
// registers.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/tlx/arch.hpp"

namespace jfa::tlx {

template <typename T>
JFA_DEVICE T warp_broadcast(const T& value, int lane = 0) {
  static_assert(std::is_trivially_copyable_v<T>, "shuffled word by word");
  constexpr int kWords = static_cast<int>((sizeof(T) + 3) / 4);
  uint32_t words[kWords] = {};
  memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) words[i] = __shfl_sync(0xffffffffu, words[i], lane);
  T out;
  memcpy(&out, words, sizeof(T));
  return out;
}

}  // namespace jfa::tlx
