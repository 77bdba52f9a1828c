#!/usr/bin/env bash
# Sets up, builds and runs every test this machine can run: the release build (GPU tests report
# "skipped" without a GPU), a tuning build of the library (with CUDA), the Python package tests, the torch op library and the torch tests on
# the CPU (when torch can be installed), two minutes of fuzzing the C ABI (JFA_FUZZ_SECONDS changes
# that), then the C++ tests under AddressSanitizer and UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)

echo "== generated sources are up to date"
python3 tools/gen_wgmma_ops.py --check

echo "== release build and tests"
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== tuning build of the library (the Hopper forward's alternatives compile)"
  cmake -S . -B build/tuning -G Ninja -DCMAKE_BUILD_TYPE=Release -DJFA_SM90_TUNING=ON \
    -DJFA_BUILD_TESTS=OFF -DJFA_BUILD_TOOLS=OFF -DJFA_BUILD_BENCH=OFF -DJFA_TORCH_OPS=OFF >/dev/null
  cmake --build build/tuning -j "$jobs" --target jfa_lib
fi

echo "== Python package tests (torch and CUDA tests report why they skip)"
JFA_LIBRARY="$PWD/build/release/src/libjfa.so" python3 -m pytest tests/python -q -rs

echo "== torch op library and torch tests on the CPU (native ops, then JFA_TORCH_OPS=ctypes)"
scripts/torch-cpu-tests.sh build/release

echo "== the C ABI under libFuzzer with ASan and UBSan (${JFA_FUZZ_SECONDS:-120} s)"
scripts/fuzz.sh "${JFA_FUZZ_SECONDS:-120}"

echo "== AddressSanitizer + UBSan build and tests"
cmake --preset sanitize
cmake --build --preset sanitize -j "$jobs"
ctest --preset sanitize -j "$jobs"

