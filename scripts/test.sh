#!/usr/bin/env bash
# Sets up, builds and runs every test this machine can run: the release build (GPU tests report
# "skipped" without a GPU), a tuning build of the library (with CUDA), the Python package tests,
# the torch op library and the torch tests on the CPU (when torch can be installed), two minutes
# of fuzzing the C ABI (JFA_FUZZ_SECONDS changes that), then the C++ tests under AddressSanitizer
# and UBSan. Each step first prints what it runs and about how long that takes on 2 cores (a first
# run; later runs rebuild only what changed).
#
# --cpu (or cpu), for a machine without a GPU or nvcc: the same steps for the CPU backend, with
# the `cpu` preset (build/cpu, no CUDA kernels) instead of `release`, no tuning build and 20 s of
# fuzzing.
#
# usage: scripts/test.sh [--cpu]
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") cpu=0 ;;
  --cpu | cpu) cpu=1 ;;
  *) echo "usage: scripts/test.sh [--cpu]" >&2; exit 2 ;;
esac
scripts/setup.sh
jobs=$(nproc)

echo "== generated sources are up to date"
python3 tools/gen_wgmma_ops.py --check

if ((cpu)); then
  preset=cpu fuzz_seconds=${JFA_FUZZ_SECONDS:-20}
  echo "== CPU build (preset cpu, no CUDA) and its tests (about 40 s on 2 cores)"
else
  preset=release fuzz_seconds=${JFA_FUZZ_SECONDS:-120}
  echo "== release build and tests (about 3 min on 2 cores with nvcc, for the sm_90a kernels; 40 s without)"
fi
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$jobs"
ctest --preset "$preset" -j "$jobs"

if ((!cpu)) && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  echo "== tuning build of the library (the Hopper forward's alternatives compile; about 2 min on 2 cores)"
  cmake -S . -B build/tuning -G Ninja -DCMAKE_BUILD_TYPE=Release -DJFA_SM90_TUNING=ON \
    -DJFA_BUILD_TESTS=OFF -DJFA_BUILD_TOOLS=OFF -DJFA_BUILD_BENCH=OFF -DJFA_TORCH_OPS=OFF >/dev/null
  cmake --build build/tuning -j "$jobs" --target jfa_lib
fi

echo "== Python package tests (torch and CUDA tests report why they skip; about 15 s)"
JFA_LIBRARY="$PWD/build/$preset/src/libjfa.so" python3 -m pytest tests/python -q -rs

echo "== torch op library and torch tests on the CPU (native ops, then JFA_TORCH_OPS=ctypes; about 1.5 min on 2 cores, after a download of ~850 MB the first time)"
scripts/torch-cpu-tests.sh "build/$preset"

echo "== the C ABI under libFuzzer with ASan and UBSan (${fuzz_seconds} s, after about 20 s of building)"
scripts/fuzz.sh "$fuzz_seconds"

echo "== AddressSanitizer + UBSan build and tests (about 1 min on 2 cores)"
cmake --preset sanitize
cmake --build --preset sanitize -j "$jobs"
ctest --preset sanitize -j "$jobs"

echo "== all passed in $((SECONDS / 60)) min $((SECONDS % 60)) s"
