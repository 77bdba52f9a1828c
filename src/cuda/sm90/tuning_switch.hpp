// Run-time tuning switches of the Hopper forward: environment variables that force a choice the
// library otherwise makes itself, for A/B measurements and tests (every choice computes the same
// function). They are read once, at the first launch, so that a call reads no environment;
// jfa_sm90_reload_tuning_switches() reads them again (for tests that change them in-process).
#pragma once

#include "jfa/jfa.h"

namespace jfa::sm90 {

enum class TuningSwitch { kD64Rows, kD128Keys, kSchedule, kLpt, kHeadMajor, kPdl, kCount };

// The value that the switch's environment variable spelled (in decimal) when it was read, if it
// is one of the values that switch accepts, else `otherwise`.
int tuning_switch(TuningSwitch which, int otherwise);

}  // namespace jfa::sm90

extern "C" JFA_API void jfa_sm90_reload_tuning_switches(void);
