// Ordering between the generic proxy (ordinary loads/stores) and the async proxy (TMA, wgmma
// operands in shared memory).
#pragma once

#include "cuda/tlx/arch.hpp"

namespace jfa::tlx {

// Shared memory written by ordinary stores that TMA or wgmma read next: each writing thread fences,
// then the threads synchronise.
JFA_DEVICE void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Full async-proxy fence over all state spaces.
JFA_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async;" ::: "memory"); }

}  // namespace jfa::tlx
