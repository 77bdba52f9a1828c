"""Exceptions raised by jfa."""

from __future__ import annotations

# Status codes of the C ABI (include/jfa/jfa.h).
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_UNSUPPORTED = 2
ERROR_BACKEND_UNAVAILABLE = 3
ERROR_CUDA = 4
ERROR_OUT_OF_MEMORY = 5
ERROR_INTERNAL = 6

STATUS_NAMES = {
    SUCCESS: "success",
    ERROR_INVALID_ARGUMENT: "invalid argument",
    ERROR_UNSUPPORTED: "unsupported",
    ERROR_BACKEND_UNAVAILABLE: "backend unavailable",
    ERROR_CUDA: "CUDA error",
    ERROR_OUT_OF_MEMORY: "out of memory",
    ERROR_INTERNAL: "internal error",
}


class JfaError(RuntimeError):
    """A libjfa entry point returned an error status.

    ``status`` is the ``jfa_status`` code and ``message`` the library's message, which names the
    argument and the rule that was broken.
    """

    def __init__(self, status: int, message: str, function: str = ""):
        self.status = int(status)
        self.message = message
        self.function = function
        name = STATUS_NAMES.get(self.status, f"status {self.status}")
        where = f"{function}: " if function else ""
        super().__init__(f"{where}{message} [{name}]" if message else f"{where}{name}")


class JfaInvalidArgumentError(JfaError, ValueError):
    """JFA_ERROR_INVALID_ARGUMENT: a value breaks a documented rule (also a ValueError)."""


class JfaUnsupportedError(JfaError):
    """JFA_ERROR_UNSUPPORTED: valid, but not implemented for this backend, dtype or shape."""


class JfaBackendUnavailableError(JfaError):
    """JFA_ERROR_BACKEND_UNAVAILABLE: the backend is not built or has no device."""


class JfaCudaError(JfaError):
    """JFA_ERROR_CUDA: a CUDA runtime call or a kernel launch failed."""


class JfaOutOfMemoryError(JfaError, MemoryError):
    """JFA_ERROR_OUT_OF_MEMORY."""


class LibraryNotFoundError(OSError):
    """libjfa.so could not be found or loaded."""


_CLASSES = {
    ERROR_INVALID_ARGUMENT: JfaInvalidArgumentError,
    ERROR_UNSUPPORTED: JfaUnsupportedError,
    ERROR_BACKEND_UNAVAILABLE: JfaBackendUnavailableError,
    ERROR_CUDA: JfaCudaError,
    ERROR_OUT_OF_MEMORY: JfaOutOfMemoryError,
}


def error_from_status(status: int, message: str, function: str = "") -> JfaError:
    """The exception for a failed status: a JfaError subclass chosen by the status."""
    return _CLASSES.get(int(status), JfaError)(status, message, function)
