// Warp-group roles: a warp-specialized kernel gives registers away in its producer group and takes
// them in its consumer groups. setmaxnreg only takes effect when the kernel has a register cap at
// entry (__launch_bounds__(threads, 1)) and each role is one branch of a single if/else.
#pragma once

#include "cuda/tlx/arch.hpp"

namespace jfa::tlx {

template <uint32_t kRegs>
JFA_DEVICE void warpgroup_reg_dealloc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes 24..256, step 8");
#if JFA_TLX_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
#endif
}

template <uint32_t kRegs>
JFA_DEVICE void warpgroup_reg_alloc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes 24..256, step 8");
#if JFA_TLX_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
#endif
}

}  // namespace jfa::tlx
