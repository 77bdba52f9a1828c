"""Optional torch: imported when installed; the custom ops are registered on import."""

from __future__ import annotations

import os

torch = None
ops = None  # the jfa._torch_ops module when torch is usable
unavailable_reason = ""

if os.environ.get("JFA_DISABLE_TORCH", "") not in ("", "0"):
    unavailable_reason = "disabled by JFA_DISABLE_TORCH"
else:
    try:
        import torch as _torch
    except ImportError as e:
        unavailable_reason = f"torch is not installed ({e})"
    except Exception as e:  # a broken torch install must not break the numpy path
        unavailable_reason = f"importing torch failed: {type(e).__name__}: {e}"
    else:
        if not hasattr(_torch, "library") or not hasattr(_torch.library, "custom_op"):
            unavailable_reason = (f"torch {_torch.__version__} lacks torch.library.custom_op "
                                  "(torch >= 2.4 is needed)")
        else:
            torch = _torch
            try:
                from . import _torch_ops as ops  # noqa: F401  (registers torch.ops.jfa.*)
            except ImportError as e:  # a torch without what the registration needs
                torch = None
                unavailable_reason = f"the jfa torch ops cannot be registered: {e}"
