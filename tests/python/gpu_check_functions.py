"""Functions of scripts/gpu-check.sh for tests that source them alone (the rest stubbed)."""

from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


def functions(*names):
    """A command printing the named functions' definitions (each from its `name()` line to the
    first `}` line after it), for `source <(...)` in bash."""
    ranges = " ".join(f"-e '/^{name}()/,/^}}/p'" for name in names)
    return f"sed -n {ranges} {SCRIPT}"
