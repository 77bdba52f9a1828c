"""Optional torch: imported when installed; the custom ops are registered on import."""

from __future__ import annotations

import os

torch = None
ops = None  # the jfa._torch_ops module when torch is usable
unavailable_reason = ""

# Torch internals the autograd registration of the ops uses (jfa._torch_ops._register_autograd:
# public torch.library refuses an autograd formula for an op that writes an argument, and the
# device_check word is one). Tested with torch 2.11.
PRIVATE_API = (("torch._library.autograd", "make_autograd_impl"),
               ("torch._library.autograd", "Info"),
               ("torch._C", "_after_ADInplaceOrView_keyset"),
               ("torch._C", "_AutoDispatchBelowADInplaceOrView"))


def missing_private_api():
    """The first of PRIVATE_API that the imported torch lacks, as "module.name", or None."""
    import importlib

    for module, name in PRIVATE_API:
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = False
        if not found:
            return f"{module}.{name}"
    return None


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
            missing = missing_private_api()
            if missing is not None:
                unavailable_reason = (f"the jfa torch ops cannot be registered: torch "
                                      f"{_torch.__version__} lacks {missing}, which their "
                                      "autograd registration uses (tested with torch 2.11)")
            else:
                torch = _torch
                from . import _torch_ops as ops  # noqa: F401  (registers torch.ops.jfa.*)
