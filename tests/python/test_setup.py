"""setup.py in an environment that cannot build a wheel (pip install --no-build-isolation with a
setuptools older than 70.1 and no wheel package): a clear error before anything is built."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# setup.py run as pip runs it, with bdist_wheel importable from neither setuptools nor wheel (what
# a setuptools older than 70.1 without the wheel package gives).
RUN_WITHOUT_BDIST_WHEEL = """
import importlib.abc, runpy, sys

class NoBdistWheel(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("setuptools.command.bdist_wheel", "wheel") or name.startswith("wheel."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoBdistWheel())
sys.argv = ["setup.py"] + sys.argv[1:]
runpy.run_path("setup.py", run_name="__main__")
"""


@pytest.mark.parametrize("command", [["bdist_wheel"], ["dist_info", "--output-dir", "meta"]],
                         ids=["bdist_wheel", "dist_info"])
def test_wheel_build_without_bdist_wheel_says_what_to_install(tmp_path, command):
    if not (ROOT / "setup.py").is_file():
        pytest.skip("not a source checkout")
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "python" / "jfa", tmp_path / "python" / "jfa",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    r = subprocess.run([sys.executable, "-c", RUN_WITHOUT_BDIST_WHEEL, *command], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stdout[-2000:]
    assert "invalid command" not in r.stderr, r.stderr[-2000:]
    assert 'needs the wheel package (setuptools >= 70.1 has it built in): pip install ' \
           '"setuptools>=70.1" (or pip install wheel) first' in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "build").exists(), "the library was built before the error"
