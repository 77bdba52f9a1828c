// Programmatic dependent launch: a kernel launched with programmatic stream serialization may
// start while the kernel before it in the stream still runs, once that one allows it; it does its
// setup, then waits for the earlier kernel's results before it reads them.
#pragma once

#include "cuda/tlx/arch.hpp"

namespace jfa::tlx {

// Lets the kernel after this one in the stream start (it still waits in wait_for_prior_grid for
// this kernel's memory operations). Every thread of the CTA calls it.
JFA_DEVICE void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Waits until the kernel this one depends on has finished and its writes are visible; a no-op when
// the kernel was launched without the programmatic dependency. Every thread that reads the earlier
// kernel's results calls it (or synchronises with one that did).
JFA_DEVICE void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace jfa::tlx
