// Run-time tuning switches of the Hopper forward, compiled in tuning builds only (CMake
// -DJFA_SM90_TUNING=ON): environment variables that force a choice that choices.hpp otherwise
// makes, for A/B measurements (every choice computes the same function). They are read once, at
// the first launch; jfa_sm90_reload_tuning_switches() reads them again.
#pragma once

#include "jfa/jfa.h"

namespace jfa::sm90 {

enum class TuningSwitch { kD64Rows, kD128Keys, kSchedule, kLpt, kHeadMajor, kPdl, kCount };

// The value that the switch's environment variable spelled (in decimal) when it was read, if it
// is one of the values that switch accepts, else `otherwise`.
int tuning_switch(TuningSwitch which, int otherwise);

}  // namespace jfa::sm90

extern "C" JFA_API void jfa_sm90_reload_tuning_switches(void);
