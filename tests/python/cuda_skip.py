"""Why the CUDA tests of the torch ops cannot run on this machine ("" when they can): they need
torch with CUDA, a compute-capability-9.0 (Hopper) GPU and a libjfa whose CUDA backend is usable."""

import torch

import jfa


def cuda_skip_reason():
    if not torch.cuda.is_available():
        return "CUDA is not available to torch (no GPU, or a CPU-only torch build)"
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        return (f"needs a compute-capability-9.0 (Hopper) GPU, got {torch.cuda.get_device_name()} "
                f"(compute capability {capability[0]}.{capability[1]})")
    if not jfa.cuda_available():
        return (f"the loaded libjfa ({jfa.library_path()}) has no usable CUDA backend (built "
                "without CUDA, or it cannot reach the GPU)")
    return ""
