"""Builds libjfa with CMake and ships it inside the ``jfa`` package.

Environment:
  JFA_LIBRARY          an existing libjfa.so to ship instead of building one
  JFA_ENABLE_CUDA      AUTO (default: CUDA when nvcc is found), ON or OFF
  JFA_CUDA_ARCHITECTURES  passed through to CMake (default 90a)
  JFA_BUILD_DIR        the CMake build directory (default build/python in the source tree)
  JFA_TORCH_OPS        AUTO (default: the torch op library when torch is importable here, which
                       under pip needs --no-build-isolation), ON or OFF
  JFA_TORCH_DIR        a torch package directory to build the op library against
  CMAKE_BUILD_PARALLEL_LEVEL  parallel jobs (default: the number of CPUs)
  CMAKE_ARGS           extra arguments for the CMake configure step
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LIBRARY = "libjfa.so"
TORCH_OPS_LIBRARY = "libjfa_torch.so"


def _log(message):
    print(f"jfa: {message}", file=sys.stderr, flush=True)


def _cmake():
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("building libjfa needs CMake >= 3.25 on PATH (or set JFA_LIBRARY to an "
                           "existing libjfa.so)")
    return cmake


def build_library() -> Path:
    """Configures and builds libjfa (and the torch op library where torch is found); returns the
    path of libjfa.so."""
    if not (ROOT / "CMakeLists.txt").is_file() or not (ROOT / "src").is_dir():
        raise RuntimeError(f"{ROOT} holds no libjfa sources (CMakeLists.txt, src/): build from a "
                           "source checkout, or set JFA_LIBRARY to an existing libjfa.so")
    cmake = _cmake()
    build_dir = Path(os.environ.get("JFA_BUILD_DIR") or ROOT / "build" / "python").resolve()
    args = [
        cmake, "-S", str(ROOT), "-B", str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DJFA_BUILD_TESTS=OFF", "-DJFA_BUILD_TOOLS=OFF", "-DJFA_BUILD_BENCH=OFF",
        f"-DJFA_ENABLE_CUDA={os.environ.get('JFA_ENABLE_CUDA', 'AUTO')}",
        f"-DJFA_TORCH_OPS={os.environ.get('JFA_TORCH_OPS', 'AUTO')}",
        f"-DPython3_EXECUTABLE={sys.executable}",
    ]
    if os.environ.get("JFA_TORCH_DIR"):
        args.append(f"-DJFA_TORCH_DIR={os.environ['JFA_TORCH_DIR']}")
    if os.environ.get("JFA_CUDA_ARCHITECTURES"):
        args.append(f"-DJFA_CUDA_ARCHITECTURES={os.environ['JFA_CUDA_ARCHITECTURES']}")
    if not (build_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
        args += ["-G", "Ninja"]
    args += shlex.split(os.environ.get("CMAKE_ARGS", ""))
    _log(" ".join(args))
    subprocess.run(args, check=True)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    build = [cmake, "--build", str(build_dir), "-j", jobs]  # tests, tools and benchmarks are off
    _log(" ".join(build))
    subprocess.run(build, check=True)
    lib = build_dir / "src" / LIBRARY
    if not lib.exists():
        raise RuntimeError(f"the CMake build did not produce {lib}")
    return lib


class BuildPyWithLibrary(build_py):
    """build_py, then put libjfa.so (built or given by JFA_LIBRARY) into the package."""

    def run(self):
        super().run()
        if self.dry_run:
            return
        given = os.environ.get("JFA_LIBRARY")
        if given:
            lib = Path(given)
            if lib.is_dir():
                lib = lib / LIBRARY
            if not lib.is_file():
                raise RuntimeError(f"JFA_LIBRARY={given} is not an existing libjfa.so")
            _log(f"using the existing library {lib}")
        else:
            lib = build_library()
        dest_dir = Path(self.build_lib) / "jfa"
        dest_dir.mkdir(parents=True, exist_ok=True)
        # Copy the real file behind the libjfa.so -> .so.0 -> .so.0.1.0 symlinks.
        shutil.copyfile(lib.resolve(), dest_dir / LIBRARY)
        _log(f"copied {lib.resolve()} to {dest_dir / LIBRARY}")
        ops = lib.parent / TORCH_OPS_LIBRARY
        if ops.is_file():
            shutil.copyfile(ops, dest_dir / TORCH_OPS_LIBRARY)
            _log(f"copied {ops} to {dest_dir / TORCH_OPS_LIBRARY}")
        else:
            _log(f"no {TORCH_OPS_LIBRARY} (torch was not found at build time): the torch ops "
                 "will be Python over ctypes")

    def get_outputs(self, include_bytecode=True):
        outputs = [Path(self.build_lib) / "jfa" / name for name in (LIBRARY, TORCH_OPS_LIBRARY)]
        return super().get_outputs(include_bytecode) + [str(p) for p in outputs if p.exists()]


class BinaryDistribution(Distribution):
    """The package holds a native library: wheels are platform-specific."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildPyWithLibrary}

# What pip runs to build a wheel (or its metadata): each needs bdist_wheel, which setuptools has
# built in from 70.1 on and older ones take from the wheel package.
WHEEL_COMMANDS = {"bdist_wheel", "dist_info", "editable_wheel"}

try:
    try:
        from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:
    if WHEEL_COMMANDS & set(sys.argv[1:]):
        import setuptools

        # Without it, setuptools fails later with "invalid command 'bdist_wheel'".
        sys.exit(f"error: building jfa with setuptools {setuptools.__version__} needs the wheel "
                 "package (setuptools >= 70.1 has it built in): pip install \"setuptools>=70.1\" "
                 "(or pip install wheel) first, or let pip build in an isolated environment (no "
                 "--no-build-isolation)")
else:
    class BdistWheel(_bdist_wheel):  # ctypes, no Python C API: tag wheels py3-none-<platform>
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
