#!/usr/bin/env bash
# Sets up, builds and runs `jfa demo` (the GPU when one is usable, the CPU otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target jfa_cli
exec build/release/tools/jfa demo "$@"
