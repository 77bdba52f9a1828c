"""The source distribution carries what setup.py needs to build libjfa with CMake."""

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_sdist_holds_the_cmake_project(tmp_path):
    if not (ROOT / "setup.py").is_file():
        pytest.skip("not a source checkout")
    # Build from a copy of the tracked sources so that no build output of the checkout leaks in.
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if files.returncode != 0:
        pytest.skip("git ls-files is not available")
    tracked = set(files.stdout.split())
    untracked = [p.relative_to(ROOT).as_posix() for p in (ROOT / "src").rglob("*")
                 if p.suffix in (".cpp", ".cu") and p.relative_to(ROOT).as_posix() not in tracked]
    if untracked:
        pytest.skip(f"git's index does not list sources this tree holds ({untracked[0]}, ...): "
                    "a copy of the tree beside an older .git, or files not yet added")
    for name in files.stdout.split():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")],
                         cwd=src, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    (archive,) = (tmp_path / "dist").glob("jfa-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {Path(*Path(n).parts[1:]).as_posix() for n in tar.getnames()}
    for needed in ["CMakeLists.txt", "src/CMakeLists.txt", "include/jfa/jfa.h", "include/jfa/jfa.hpp",
                   "src/api/validate.cpp", "src/cuda/sm90/forward/fwd_kernel.cuh",
                   "src/cuda/tlx/wgmma_ops.inc", "src/torch/registration.cpp",
                   "src/torch/CMakeLists.txt", "python/jfa/__init__.py", "setup.py",
                   "cmake/Sm90Shapes.cmake", "src/cuda/sm90/shapes.def"]:
        assert needed in names, f"{needed} missing from the source distribution"
    # Every source file the library's CMake build names travels too, and the templates it
    # generates sources from (configure_file inputs); generated names (${...}) are not sources.
    listed = "\n".join(line.partition("#")[0]
                        for line in (ROOT / "src" / "CMakeLists.txt").read_text().splitlines())
    for token in re.findall(r"[\w./${}-]+\.(?:cpp|cu|in)(?![\w.])", listed):
        if "${" not in token:
            assert f"src/{token}" in names, f"src/{token} missing from the source distribution"
