// The forward of one tile shape (dtype, head_dim, consumer groups, keys per K tile, value head
// size) with the
// shipped choices of choices.hpp; in a tuning build, with the choices that the JFA_SM90_*
// environment variables ask for (read once, see tuning_switch.hpp).
#pragma once

#include "cuda/sm90/forward/fwd_launch.cuh"
#include "cuda/sm90/forward/fwd_sm90.hpp"
#ifdef JFA_SM90_TUNING
#include "cuda/sm90/host/tuning_switch.hpp"
#endif

namespace jfa::sm90 {

#ifdef JFA_SM90_TUNING
template <typename T, int kHeadDim, int kGroups, int kKeys, int kHeadDimV, Mainloop kLoop>
jfa_status forward_tuned(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                         const LaunchChoices& launch, bool head_major) {
  using HeadMajor = FwdConfig<T, kHeadDim, kGroups, kKeys, KernelChoices<kLoop, true>, kHeadDimV>;
  using TileMajor = FwdConfig<T, kHeadDim, kGroups, kKeys, KernelChoices<kLoop, false>, kHeadDimV>;
  return head_major ? run_forward<HeadMajor>(p, device, launch)
                    : run_forward<TileMajor>(p, device, launch);
}
#endif

template <typename T, int kHeadDim, int kGroups, int kKeys, int kHeadDimV>
jfa_status forward_shape(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device) {
  // Windows and softcap: the shipped choices with local attention, in tuning builds too; softcap
  // on kernels of its own. Sinks alone take the plain kernels (only a row's end reads them).
  if (p.uses_window_or_softcap()) {
    if (p.softcap > 0.f) {
      // Not with three groups or 160 keys (choices.hpp): no such kernel is built.
      if constexpr (kGroups == 3 || kKeys > 128)
        return jfa::detail::fail(JFA_ERROR_INTERNAL,
                                 "no softcap kernel with %d consumer groups and %d keys a tile",
                                 kGroups, kKeys);
      else
        return run_forward<FwdConfig<T, kHeadDim, kGroups, kKeys,
                                     WithLocalAttention<ShippedKernel, true>, kHeadDimV> >(
            p, device, kShippedLaunch);
    }
    return run_forward<
        FwdConfig<T, kHeadDim, kGroups, kKeys, WithLocalAttention<ShippedKernel>, kHeadDimV> >(
        p, device, kShippedLaunch);
  }
#ifdef JFA_SM90_TUNING
  const LaunchChoices launch{
      tuning_switch(TuningSwitch::kLpt, kShippedLaunch.sort_work_list) != 0,
      tuning_switch(TuningSwitch::kPdl, kShippedLaunch.dependent_launch) != 0};
  const bool head_major =
      tuning_switch(TuningSwitch::kHeadMajor, ShippedKernel::kHeadMajorRuns) != 0;
  switch (static_cast<Mainloop>(
      tuning_switch(TuningSwitch::kSchedule, static_cast<int>(ShippedKernel::kMainloop)))) {
    case Mainloop::kOneTileAtATime:
      return forward_tuned<T, kHeadDim, kGroups, kKeys, kHeadDimV, Mainloop::kOneTileAtATime>(
          p, device, launch, head_major);
    case Mainloop::kOverlappedIndependent:
      return forward_tuned<T, kHeadDim, kGroups, kKeys, kHeadDimV,
                           Mainloop::kOverlappedIndependent>(p, device, launch, head_major);
    case Mainloop::kOverlappedTakingTurns:
      break;
  }
  return forward_tuned<T, kHeadDim, kGroups, kKeys, kHeadDimV, Mainloop::kOverlappedTakingTurns>(
      p, device, launch, head_major);
#else
  return run_forward<FwdConfig<T, kHeadDim, kGroups, kKeys, ShippedKernel, kHeadDimV> >(
      p, device, kShippedLaunch);
#endif
}

}  // namespace jfa::sm90
