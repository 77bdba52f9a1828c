// Forwards through kernel variants that the library does not pick for a call: a forced tile shape,
// a main loop or item order that lost the measurements (instantiated in the test binary; the
// shipped library holds only the default kernels), or other launch choices.
#pragma once

#include <string>

#include "common/params.hpp"
#include "cuda/common/device_facts.hpp"
#include "jfa/jfa.h"

namespace jfa::gpu_test {

enum class VariantLoop { kShipped, kOneTileAtATime, kOverlappedIndependent };

struct KernelVariant {
  int d64_groups = 0;  // consumer groups at head_dim 64 (2 or 3); 0: the library's choice
  int d128_keys = 0;   // keys per K tile at head_dim 128 (128 or 160); 0: the library's choice
  VariantLoop loop = VariantLoop::kShipped;  // kOverlappedIndependent runs tile-major items
  bool sort_work_list = false;
  bool dependent_launch = true;

  std::string describe() const;
};

// The forward of `params` (valid, device buffers, a supported dtype and head_dim) through the
// variant. Returns the status; a failure's message goes to stderr (it is recorded in the test
// binary's copy of the error state, not in the library's jfa_last_error_message()).
jfa_status forward_variant(const jfa_attention_params* params, const KernelVariant& variant);

// The variant that AttentionRunner-style callers use instead of jfa_attention_forward while an
// instance lives (nullptr: the library's entry).
const KernelVariant* active_variant();

class ScopedVariant {
 public:
  explicit ScopedVariant(const KernelVariant& v);
  ~ScopedVariant();
  ScopedVariant(const ScopedVariant&) = delete;
  ScopedVariant& operator=(const ScopedVariant&) = delete;

 private:
  const KernelVariant* previous_;
  KernelVariant variant_;
};

// One per set of kernel choices (kernel_variants_*.cu).
jfa_status forward_shipped(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                           const KernelVariant& v);
jfa_status forward_one_tile(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                            const KernelVariant& v);
jfa_status forward_independent(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                               const KernelVariant& v);

}  // namespace jfa::gpu_test
