"""A bench script as a user meets it on a machine without torch: importing it loads no torch, and
its --help works."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def help_without_torch(script, env=None):
    """Asserts that importing bench/<script>.py loads no torch; returns its --help text."""
    code = ("import sys; sys.path.insert(0, %r); import %s; "
            "print('torch' in sys.modules)" % (str(BENCH), script))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    r = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--help"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout
