// A ring of shared-memory buffers that a producer fills by TMA and consumers hand back: per stage
// a full barrier (the producer's one thread arrives with the byte count of its loads, which
// complete the phase) and an empty barrier (the consumers arrive, `consumer_arrivals` in all).
// Each role walks the ring with its own PipelineState (stage and parity), so the ring holds only
// the barriers; a ring of one stage (one buffer handed back and forth) is walked with the parity
// alone.
//
// TmaRing keeps its barriers (full ones, then empty ones); TmaRingRef walks barriers that lie
// elsewhere, in two arrays of kStages.
#pragma once

#include "cuda/tlx/mbarrier.hpp"

namespace jfa::tlx {

template <int kStages>
struct RingBarriers {
  MBarrier full[kStages], empty[kStages];
};

template <int kStages>
struct RingBarrierPointers {
  MBarrier* full;
  MBarrier* empty;
};

template <int kStages, typename Barriers = RingBarriers<kStages>>
struct TmaRing : Barriers {
  using State = PipelineState<kStages>;

  // One thread initialises, as for MBarrier::init.
  JFA_DEVICE void init(uint32_t consumer_arrivals) {
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      this->full[i].init(1);
      this->empty[i].init(consumer_arrivals);
    }
  }

  // Producer: waits (suspended) until the consumers have handed the stage's buffer back from its
  // previous round.
  JFA_DEVICE void acquire(const State& st) const {
    this->empty[st.stage].wait_suspended(st.phase ^ 1u);
  }

  // Producer: arrives on the stage's full barrier announcing `bytes` of loads, and returns the
  // barrier those loads complete.
  JFA_DEVICE MBarrier* commit(const State& st, uint32_t bytes) {
    MBarrier* bar = &this->full[st.stage];
    bar->arrive_expect_tx(bytes);
    return bar;
  }

  // Producer: hands the stage over with nothing loaded.
  JFA_DEVICE void commit_empty(const State& st) { this->full[st.stage].arrive(); }

  // Consumer: waits until the stage's buffer has arrived.
  JFA_DEVICE void wait(const State& st) const { this->full[st.stage].wait(st.phase); }

  // Consumer: one arrival on the stage's empty barrier, once the buffer's reads are done.
  JFA_DEVICE void release(const State& st) { this->empty[st.stage].arrive(); }

  // The same for a ring of one stage, at the parity `phase`.
  JFA_DEVICE void acquire(uint32_t phase) const {
    static_assert(kStages == 1, "one stage");
    this->empty[0].wait_suspended(phase ^ 1u);
  }
  JFA_DEVICE MBarrier* commit(uint32_t bytes) {
    static_assert(kStages == 1, "one stage");
    this->full[0].arrive_expect_tx(bytes);
    return &this->full[0];
  }
  JFA_DEVICE void commit_empty() {
    static_assert(kStages == 1, "one stage");
    this->full[0].arrive();
  }
  JFA_DEVICE void wait(uint32_t phase) const {
    static_assert(kStages == 1, "one stage");
    this->full[0].wait(phase);
  }
  JFA_DEVICE void release() {
    static_assert(kStages == 1, "one stage");
    this->empty[0].arrive();
  }
};

template <int kStages>
using TmaRingRef = TmaRing<kStages, RingBarrierPointers<kStages>>;

}  // namespace jfa::tlx
