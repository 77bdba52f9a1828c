#!/usr/bin/env bash
# Tuning run of the sm90 forward on a GPU machine: builds libjfa as a tuning build
# (-DJFA_SM90_TUNING=ON: the alternatives of choices.hpp compiled in, picked by the JFA_SM90_*
# switches; with the GPU tests and the CLI) and variants, runs the attention GPU tests (quick mode) on every build whose kernel
# source differs, then times every variant (one process each) under the run-time switches with
# bench/tune_sm90.py (each output checked first). Logs go to OUTDIR.
#
# usage: scripts/tune-sm90.sh OUTDIR [VARIANT ...]
#   VARIANT: NAME=CUDA_FLAGS   this tree built with extra flags (e.g. stages3=-DJFA_SM90_KV_STAGES=3)
#            NAME=@DIR         another source tree, e.g. a worktree of another revision carried along
#            NAME="@DIR FLAGS" that tree built with extra flags
# env:   TUNE_ARGS (extra arguments of bench/tune_sm90.py, e.g. "--workloads W1,W4 --triton
#        --rounds 3"), TUNE_LIB_ROUNDS (times the builds take turns, default 1), TEST_TIMEOUT and
#        TUNE_TIMEOUT (seconds per test run and per timing process; defaults 120 and 240, so that
#        a hang cannot stall the whole run)
set -u -o pipefail
OUT=${1:?usage: scripts/tune-sm90.sh OUTDIR [NAME=CUDA_FLAGS ...]}
shift
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 4)
EXTRA=()
[ -d .gtest ] && EXTRA+=("-DCMAKE_PREFIX_PATH=$PWD/.gtest")

build() {  # build BUILD_DIR TARGETS CUDA_FLAGS [SOURCE_DIR]
  cmake -S "${4:-.}" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DJFA_BUILD_TOOLS=ON \
    -DJFA_BUILD_BENCH=OFF -DJFA_SM90_TUNING=ON "-DCMAKE_CUDA_FLAGS=$3" "${EXTRA[@]}" >"$OUT/build-$(basename "$1").log" 2>&1 &&
    cmake --build "$1" -j"$JOBS" --target $2 >>"$OUT/build-$(basename "$1").log" 2>&1
}

gpu_tests() {  # gpu_tests BUILD_DIR NAME
  JFA_GPU_TESTS_QUICK=1 timeout "${TEST_TIMEOUT:-120}" "$1/tests/gpu/jfa_gpu_tests" \
    --gtest_filter='AttentionGpu*' >"$OUT/gpu_tests-$2.log" 2>&1
  local rc=$?
  echo "attention GPU tests ($2, quick): rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_tests-$2.log" | tr '\n' ' ')"
  return $rc
}

LIBS=()
build build/tune-base "jfa_lib jfa_cli jfa_gpu_tests" "" || { echo "default build failed"; tail -30 "$OUT/build-tune-base.log"; exit 1; }
LIBS+=(--lib "base=$PWD/build/tune-base/src/libjfa.so")
gpu_tests build/tune-base base
for spec in "$@"; do
  name=${spec%%=*}
  value=${spec#*=}
  if [ "${value:0:1}" = "@" ]; then
    # Another kernel (optionally with flags after a space): its own tests must pass before it is
    # timed.
    tree=${value:1}
    flags=""
    if [[ "$tree" == *" "* ]]; then
      flags=${tree#* }
      tree=${tree%% *}
    fi
    if build "build/tune-$name" "jfa_lib jfa_gpu_tests" "$flags" "$tree" && gpu_tests "build/tune-$name" "$name"; then
      LIBS+=(--lib "$name=$PWD/build/tune-$name/src/libjfa.so")
    else
      echo "variant $name skipped (build or tests failed; see build-tune-$name.log, gpu_tests-$name.log)"
    fi
  elif build "build/tune-$name" jfa_lib "$value"; then
    LIBS+=(--lib "$name=$PWD/build/tune-$name/src/libjfa.so")
  else
    echo "variant $name failed to build (see build-tune-$name.log)"
  fi
done

# One process per build: two copies of the library (each with its static CUDA runtime) do not
# share a process. With TUNE_LIB_ROUNDS=N the builds take turns N times (A B A B ...), and the
# merged table gives the median of the rounds.
for ((round = 0; round < ${TUNE_LIB_ROUNDS:-1}; round++)); do
  for ((i = 0; i < ${#LIBS[@]}; i += 2)); do
    spec=${LIBS[i + 1]}
    name=${spec%%=*}
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout "${TUNE_TIMEOUT:-240}" python3 bench/tune_sm90.py --lib "$spec" --cli build/tune-base/tools/jfa \
      --out "$OUT/$name-r$round" --round-offset "$round" ${TUNE_ARGS:-} >"$OUT/tune-$name-r$round.log" 2>&1
    echo "tune_sm90.py ($name, round $round) rc=$?"
  done
done
shopt -s nullglob
RUNS=("$OUT"/*-r*/tune.json)
if [ ${#RUNS[@]} -gt 0 ]; then
  # shellcheck disable=SC2086
  python3 bench/tune_sm90.py --summarize "${RUNS[@]}" ${TUNE_ARGS:-}
fi
