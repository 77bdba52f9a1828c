"""Loading libjfa_torch.so, the native torch.ops.jfa.* built against PyTorch's stable ABI.

It lives next to libjfa.so (the package's copy, or the build directory that $JFA_LIBRARY points
into) and links against it by soname, so libjfa is loaded first and both share one copy. When it
is missing or does not load (a torch older than its stable-ABI target, say), the ops are defined in
Python over ctypes instead (jfa._torch_ctypes_op); ``JFA_TORCH_OPS=ctypes`` asks for that path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Tuple

LIBRARY_NAME = "libjfa_torch.so"


def library_path() -> Path:
    """Where libjfa_torch.so is looked for: next to the loaded libjfa.so."""
    from . import _library

    return Path(_library.library_path()).resolve().parent / LIBRARY_NAME


def load(torch) -> Tuple[str, str]:
    """Registers the native ops when possible. Returns ("native", path) or ("ctypes", why)."""
    if os.environ.get("JFA_TORCH_OPS", "") == "ctypes":
        return "ctypes", "JFA_TORCH_OPS=ctypes"
    try:
        path = library_path()
    except Exception as e:  # libjfa itself did not load: the ctypes path reports it on use
        return "ctypes", f"libjfa.so did not load ({e})"
    if not path.is_file():
        return "ctypes", f"{path} not found (built when torch is importable at build time)"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:
        return "ctypes", f"{path} did not load ({e})"
    return "native", str(path)


_TAGGED = re.compile(r"(TypeError|ValueError): (.*)", re.S)
_STATUS = re.compile(r"jfa status (\d+) in (\w+): (.*)", re.S)


def translate(error: RuntimeError) -> Exception:
    """The exception a native op's tagged message stands for (see src/torch/op_support.hpp): a
    TypeError, a ValueError or the JfaError of a library status; other errors as they are."""
    from ._errors import error_from_status

    message = str(error)
    m = _TAGGED.match(message)
    if m:
        return (TypeError if m.group(1) == "TypeError" else ValueError)(m.group(2))
    m = _STATUS.match(message)
    if m:
        return error_from_status(int(m.group(1)), m.group(3), m.group(2))
    return error
