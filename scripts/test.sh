#!/usr/bin/env bash
# Sets up, builds and runs every test this machine can run: the release build (GPU tests report
# "skipped" without a GPU), then the same tests under AddressSanitizer and UBSan.
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

echo "== AddressSanitizer + UBSan build and tests"
cmake --preset sanitize
cmake --build --preset sanitize -j "$jobs"
ctest --preset sanitize -j "$jobs"
