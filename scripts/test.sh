#!/usr/bin/env bash
# Sets up, builds and runs every test this machine can run: the release build (GPU tests report
# "skipped" without a GPU), the Python package tests, the torch op library and the torch tests on
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

echo "== Python package tests (torch and CUDA tests report why they skip)"
JFA_LIBRARY="$PWD/build/release/src/libjfa.so" python3 -m pytest tests/python -q -rs

echo "== torch op library and torch tests on the CPU (skipped, with the reason, without torch)"
scripts/torch-cpu-tests.sh build/release

echo "== the C ABI under libFuzzer with ASan and UBSan (${JFA_FUZZ_SECONDS:-120} s)"
scripts/fuzz.sh "${JFA_FUZZ_SECONDS:-120}"

echo "== AddressSanitizer + UBSan build and tests"
cmake --preset sanitize
cmake --build --preset sanitize -j "$jobs"
ctest --preset sanitize -j "$jobs"

