// mbarrier: the shared-memory barrier that TMA completes (transaction bytes) and that roles of a
// warp-specialized kernel use to hand buffers to each other. Phases alternate; a waiter names the
// parity of the phase it waits to see completed.
#pragma once

#include "cuda/tlx/arch.hpp"

namespace jfa::tlx {

struct alignas(8) MBarrier {
  uint64_t word;

  // One thread initialises; a block-wide barrier plus fence_barrier_init() must follow before use.
  JFA_DEVICE void init(uint32_t arrive_count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&word)),
                 "r"(arrive_count)
                 : "memory");
  }

  // Arrives once and adds `bytes` to the transaction count of the current phase.
  JFA_DEVICE void arrive_expect_tx(uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&word)),
                 "r"(bytes)
                 : "memory");
  }

  // Adds transaction bytes without arriving.
  JFA_DEVICE void expect_tx(uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&word)),
                 "r"(bytes)
                 : "memory");
  }

  JFA_DEVICE void arrive() {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&word))
                 : "memory");
  }

  // Arrives `count` times at once (for a warp whose other lanes are synchronized with this one).
  JFA_DEVICE void arrive(uint32_t count) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&word)),
                 "r"(count)
                 : "memory");
  }

  // Blocks until the phase of the given parity has completed. A fresh barrier is in phase 0, so
  // wait(1) returns at once and wait(0) waits for the first completion.
  JFA_DEVICE void wait(uint32_t parity) const {
    asm volatile(
        "{\n .reg .pred p;\n"
        "WAIT_%=:\n"
        " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra WAIT_%=;\n}" ::"r"(smem_addr(&word)),
        "r"(parity)
        : "memory");
  }

  // As wait(), for a thread that has nothing else to do meanwhile (a producer): each probe may
  // suspend it until the phase completes (at most kSuspendNs), instead of returning at once, so
  // that its polling does not take issue slots from the warps it shares a scheduler with.
  static constexpr uint32_t kSuspendNs = 1000000;
  JFA_DEVICE void wait_suspended(uint32_t parity) const {
    asm volatile(
        "{\n .reg .pred p;\n"
        "WAIT_%=:\n"
        " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1, %2;\n"
        " @!p bra WAIT_%=;\n}" ::"r"(smem_addr(&word)),
        "r"(parity), "n"(kSuspendNs)
        : "memory");
  }
};

// Makes barrier initialisation visible to the async proxy (TMA) and other threads; follow with a
// block-wide barrier.
JFA_DEVICE void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// A ring position: stage index and the parity of its current round, advanced together.
template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  JFA_DEVICE void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace jfa::tlx
