"""jfa: Jagged Flash Attention.

Exact softmax attention over variable-length sequences packed end to end ("jagged"), without
padding. Works on torch tensors (CUDA: the Hopper kernels; CPU: the CPU backend), where it is
the custom op ``torch.ops.jfa.jagged_attention_fwd`` (torch.compile and CUDA-graph friendly), and
on numpy arrays (CPU backend). The computation is done by libjfa.so; the torch ops are C++
(libjfa_torch.so) where it was built, else Python over ctypes.
"""

from __future__ import annotations

from ._errors import (JfaBackendUnavailableError, JfaCudaError, JfaError,
                      JfaInvalidArgumentError, JfaOutOfMemoryError, JfaUnsupportedError,
                      LibraryNotFoundError)
from ._library import cuda_available, library_path, device_check_message, version
from ._torch_support import unavailable_reason as _torch_unavailable_reason
from .attention import attention_reference, jagged_attention, paged_attention
from .jagged import (from_nested, lengths_to_offsets, max_length, offsets_from_position_ids,
                     offsets_to_lengths, pad, to_nested, unpad, validate_offsets)

__version__ = "0.1.0"

__all__ = [
    "jagged_attention", "attention_reference", "paged_attention", "device_check_message",
    "lengths_to_offsets", "offsets_to_lengths", "offsets_from_position_ids", "max_length",
    "validate_offsets", "pad", "unpad",
    "from_nested", "to_nested",
    "JfaError", "JfaInvalidArgumentError", "JfaUnsupportedError", "JfaBackendUnavailableError",
    "JfaCudaError", "JfaOutOfMemoryError", "LibraryNotFoundError",
    "version", "cuda_available", "library_path", "torch_available", "torch_unavailable_reason",
    "torch_ops_kind",
]


def torch_available() -> bool:
    """Whether the torch path (and ``torch.ops.jfa.*``) is available."""
    from . import _torch_support

    return _torch_support.torch is not None


def torch_unavailable_reason() -> str:
    """Why the torch path is unavailable ("" when it is available)."""
    return _torch_unavailable_reason


def torch_ops_kind() -> str:
    """How ``torch.ops.jfa.*`` are implemented: "native" (libjfa_torch.so, C++ registered with the
    dispatcher), "ctypes" (Python custom ops over the C ABI), or "" without torch."""
    from . import _torch_support

    return _torch_support.ops.KIND if _torch_support.ops is not None else ""
