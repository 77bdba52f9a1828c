// Named barriers (bar.sync / bar.arrive with an id and a thread count): synchronise a subset of the
// block, e.g. the consumer warp groups, without stopping the producer. Id 0 is __syncthreads.
#pragma once

#include "cuda/tlx/arch.hpp"

namespace jfa::tlx {

struct NamedBarrier {
  // Waits until `threads` threads (a multiple of 32) have arrived at barrier `id`.
  JFA_DEVICE static void sync(uint32_t id, uint32_t threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
  }
  // Signals arrival at barrier `id` without waiting.
  JFA_DEVICE static void arrive(uint32_t id, uint32_t threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
  }
};

}  // namespace jfa::tlx
