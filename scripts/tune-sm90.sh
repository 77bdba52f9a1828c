#!/usr/bin/env bash
# Tuning run of the sm90 forward on a GPU machine: builds the default libjfa (with the GPU tests
# and the CLI) and variants that differ in compile-time flags, runs the attention GPU tests on the
# default build (quick mode), then times every variant (one process each) under every mainloop
# schedule with bench/tune_sm90.py (each output checked first). Logs go to OUTDIR.
#
# usage: scripts/tune-sm90.sh OUTDIR [NAME=CUDA_FLAGS ...]
#   e.g. scripts/tune-sm90.sh /tmp/tune stages3=-DJFA_SM90_KV_STAGES=3
# env:   TUNE_ARGS (extra arguments of bench/tune_sm90.py, e.g. "--workloads W1,W4 --triton
#        --rounds 3"), TUNE_LIB_ROUNDS (times the builds take turns, default 1)
set -u -o pipefail
OUT=${1:?usage: scripts/tune-sm90.sh OUTDIR [NAME=CUDA_FLAGS ...]}
shift
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 4)
EXTRA=()
[ -d .gtest ] && EXTRA+=("-DCMAKE_PREFIX_PATH=$PWD/.gtest")

build() {  # build DIR TARGETS CUDA_FLAGS
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DJFA_BUILD_TOOLS=ON -DJFA_BUILD_BENCH=OFF \
    "-DCMAKE_CUDA_FLAGS=$3" "${EXTRA[@]}" >"$OUT/build-$(basename "$1").log" 2>&1 &&
    cmake --build "$1" -j"$JOBS" --target $2 >>"$OUT/build-$(basename "$1").log" 2>&1
}

LIBS=()
build build/tune-base "jfa_lib jfa_cli jfa_gpu_tests" "" || { echo "default build failed"; tail -30 "$OUT/build-tune-base.log"; exit 1; }
LIBS+=(--lib "base=$PWD/build/tune-base/src/libjfa.so")
for spec in "$@"; do
  name=${spec%%=*}
  flags=${spec#*=}
  if build "build/tune-$name" jfa_lib "$flags"; then
    LIBS+=(--lib "$name=$PWD/build/tune-$name/src/libjfa.so")
  else
    echo "variant $name failed to build (see build-tune-$name.log)"
  fi
done

JFA_GPU_TESTS_QUICK=1 timeout 300 build/tune-base/tests/gpu/jfa_gpu_tests --gtest_filter='AttentionGpu*' \
  >"$OUT/gpu_tests.log" 2>&1
echo "attention GPU tests (quick): rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_tests.log" | tr '\n' ' ')"

# One process per build: two copies of the library (each with its static CUDA runtime) do not
# share a process. With TUNE_LIB_ROUNDS=N the builds take turns N times (A B A B ...), and the
# merged table gives the median of the rounds.
for ((round = 0; round < ${TUNE_LIB_ROUNDS:-1}; round++)); do
  for ((i = 0; i < ${#LIBS[@]}; i += 2)); do
    spec=${LIBS[i + 1]}
    name=${spec%%=*}
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout 900 python3 bench/tune_sm90.py --lib "$spec" --cli build/tune-base/tools/jfa \
      --out "$OUT/$name-r$round" ${TUNE_ARGS:-} >"$OUT/tune-$name-r$round.log" 2>&1
    echo "tune_sm90.py ($name, round $round) rc=$?"
  done
done
shopt -s nullglob
RUNS=("$OUT"/*-r*/tune.json)
# shellcheck disable=SC2086
[ ${#RUNS[@]} -gt 0 ] && python3 bench/tune_sm90.py --summarize "${RUNS[@]}" ${TUNE_ARGS:-}
