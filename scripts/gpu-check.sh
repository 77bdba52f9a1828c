#!/usr/bin/env bash
# Everything the GPU machine can check: build (all cores, the torch op library included), GPU, CPU
# and Python tests (the torch ops native, then over ctypes), compute-sanitizer memcheck and
# racecheck over a reduced GPU case set, the CLI benchmark, the peers benchmark (bench/peers.py
# --quick: jfa, varlen FA2, the plain Triton JFA and the others, every output checked before
# timing), the call-overhead benchmark (bench/call_overhead.py) and the backward benchmark
# (bench/backward_peers.py: jfa's backward and training step against varlen FA2, FA3,
# FlexAttention and padded cuDNN, gradients checked against float64 before timing). Logs go to
# OUTDIR; a summary table is printed last.
#
# usage: scripts/gpu-check.sh OUTDIR
# env:   BUILD_DIR (default build/gpu-check), PREBUILT=1 (use BUILD_DIR as built elsewhere, e.g.
#        on a machine without a GPU, instead of building), SKIP_GPU_SUITE=1 (neither the GPU nor
#        the CPU ctest suite), SKIP_PYTHON=1, SKIP_SANITIZERS=1,
#        SKIP_BENCH=1, GPU_TEST_TIMEOUT
#        (default 400), SANITIZER_TOOLS (default "memcheck racecheck"), SANITIZER_TIMEOUT (default
#        600 per tool), CLI_TIMEOUT (seconds per run),
#        PEERS_FULL=1 (the full peers run instead of --quick: both dtypes, all workloads, and the
#        results JSON and chart <date>-h200.json/.png in OUTDIR), SKIP_PEERS=1,
#        CALL_OVERHEAD=quick|full|off (default quick), BWD_BENCH=quick|full|off (default quick:
#        W1 and W4, fp16, both masks, 3 rounds, the backward; full: W1-W4, the backward and the
#        training step, chart backward_peers.png in OUTDIR), FA3_LIB (FlashAttention-3's op
#        library for the call-overhead and backward benchmarks)
set -u -o pipefail
OUT=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build/gpu-check}
JOBS=$(nproc 2>/dev/null || echo 4)
declare -a SUMMARY=()
note() { SUMMARY+=("$(printf '%-28s %s' "$1" "$2")"); }
# FlashAttention-3's library needs the CUDA runtime that torch's wheels ship, which the dynamic
# loader does not find by itself.
fa3_runtime() {
  [ -n "${FA3_CUDART_DIR+set}" ] && return
  FA3_CUDART_DIR=$(python3 -c 'import glob, site; print(next(iter(sorted(glob.glob(site.getsitepackages()[0] + "/nvidia/**/libcudart.so.*", recursive=True))), "").rpartition("/")[0])' 2>/dev/null)
  [ -n "$FA3_CUDART_DIR" ] && export LD_LIBRARY_PATH="$FA3_CUDART_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# A googletest install may be carried next to the sources (.gtest/, a copy of an install prefix).
EXTRA=()
[ -d .gtest ] && EXTRA+=("-DCMAKE_PREFIX_PATH=$PWD/.gtest")

if [ -n "${PREBUILT:-}" ]; then
  note build "prebuilt ($BUILD)"
elif cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DJFA_BUILD_TOOLS=ON -DJFA_BUILD_BENCH=OFF \
     -DPython3_EXECUTABLE="$(command -v python3)" \
     "${EXTRA[@]}" >"$OUT/build.log" 2>&1 &&
   cmake --build "$BUILD" -j"$JOBS" -- -k 0 >>"$OUT/build.log" 2>&1; then
  note build ok
else
  note build "FAILED (see build.log; continuing with what was built)"
fi

GPU_TESTS=$(find "$BUILD" -name jfa_gpu_tests -type f | head -1)
if [ -z "${SKIP_GPU_SUITE:-}" ]; then
  # A hung kernel must not eat the machine's time: the GPU suite gets GPU_TEST_TIMEOUT seconds.
  (cd "$BUILD" && timeout "${GPU_TEST_TIMEOUT:-400}" ctest -L gpu --output-on-failure) >"$OUT/ctest_gpu.log" 2>&1
  note "ctest -L gpu" "$(grep -E 'tests passed|tests failed' "$OUT/ctest_gpu.log" | tail -1) $(grep -c '\[  FAILED  \]' "$OUT/ctest_gpu.log") failed-lines"
  (cd "$BUILD" && ctest -L cpu --output-on-failure -j"$JOBS") >"$OUT/ctest_cpu.log" 2>&1
  note "ctest -L cpu" "$(grep -E 'tests passed|tests failed' "$OUT/ctest_cpu.log" | tail -1)"
fi

LIB=$(find "$BUILD" -name 'libjfa.so' | head -1)
if [ -z "${SKIP_PYTHON:-}" ] && [ -n "$LIB" ] && python3 -c 'import torch, pytest' 2>/dev/null; then
  JFA_LIBRARY="$(realpath "$LIB")" PYTHONUNBUFFERED=1 timeout 600 python3 -m pytest tests/python -q -rs \
    >"$OUT/pytest.log" 2>&1
  note "pytest (torch + CUDA)" "rc=$? $(tail -1 "$OUT/pytest.log")"
  JFA_TORCH_OPS=ctypes JFA_LIBRARY="$(realpath "$LIB")" PYTHONUNBUFFERED=1 timeout 600 \
    python3 -m pytest tests/python/test_torch.py tests/python/test_torch_cuda_backward.py \
    tests/python/test_torch_cuda_graph_backward.py tests/python/test_torch_local_attention.py \
    tests/python/test_readme.py -q -rs \
    >"$OUT/pytest_ctypes.log" 2>&1
  note "pytest (ctypes torch ops)" "rc=$? $(tail -1 "$OUT/pytest_ctypes.log")"
fi

if [ -z "${SKIP_SANITIZERS:-}" ] && [ -n "$GPU_TESTS" ] && command -v compute-sanitizer >/dev/null; then
  FILTER='TlxTma.*:TlxMBarrier.*:TlxWgmma.Fp16D128N128:AttentionGpu.OtherLaunchChoicesMatchReference:AttentionGpu.EdgeLengths*:AttentionGpu.DifferentQueryAndKeyLengthsGqa:AttentionGpu.GarbageDeviceOffsetsStayInBounds:AttentionGpu.CheckedModeReportsInvalidDeviceOffsets:AttentionGpu.CheckedModeReportsResultsBeyondFloat32:AttentionGpu.NoKeysAnywhere:AttentionGpu.ManyTinySequences:AttentionGpu.AlternativeSchedulesMatchReference:AttentionGpu.ShortSequencesShareTiles:AttentionGpuApi.CallerWorkspace:AttentionGpuApi.KeptWorkspaceGrows:BackwardGpu.EdgeLengths*:BackwardGpu.CrossLengthsGqa:BackwardGpu.EmptySequences:BackwardGpu.ManyTinySequences:BackwardGpu.SharedTilesOfShortSequences:BackwardGpu.DeterministicSharedTiles:BackwardGpuApi.StaleWorkspaceDoesNotReachSharedTiles:BackwardGpu.StridedGradientLayouts:BackwardGpu.DeterministicRunsAreBitIdentical:BackwardGpuApi.CallerWorkspaceGivesTheSameGradients:BackwardGpuApi.CheckedModeReportsInvalidDeviceOffsets:BackwardGpuApi.CheckedModeReportsGradientsThatAreNotFinite'
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
    JFA_GPU_TESTS_QUICK=1 timeout "${SANITIZER_TIMEOUT:-600}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$GPU_TESTS" --gtest_filter="$FILTER" >"$OUT/$tool.log" 2>&1
    rc=$?
    note "compute-sanitizer $tool" "rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
  done
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  CLI=$(find "$BUILD" -path '*tools*' -name jfa -type f -perm -u+x | head -1)
  if [ -n "$CLI" ]; then
    : >"$OUT/cli_bench.log"
    for w in W1 W2 W3 W4; do
      for c in "" "--causal"; do
        echo "== $w $c" >>"$OUT/cli_bench.log"
        timeout "${CLI_TIMEOUT:-120}" "$CLI" bench --workload "$w" --dtype fp16 $c --backend cuda --json --no-padded \
          >>"$OUT/cli_bench.log" 2>&1 || echo "(exit $?)" >>"$OUT/cli_bench.log"
      done
    done
    note "jfa bench W1..W4" "see cli_bench.log"
  else
    note "jfa bench W1..W4" "skipped (no CLI binary)"
  fi
  if [ -n "$LIB" ] && [ "${CALL_OVERHEAD:-quick}" != off ] && python3 -c 'import torch' 2>/dev/null; then
    CALL=(--lib "$LIB" --out "$OUT")
    [ "${CALL_OVERHEAD:-quick}" = quick ] && CALL+=(--quick)
    [ -n "${CLI:-}" ] && CALL+=(--cli "$CLI")
    if [ -n "${FA3_LIB:-}" ]; then
      CALL+=(--fa3-lib "$FA3_LIB")
      fa3_runtime
    fi
    PYTHONUNBUFFERED=1 timeout 900 python3 bench/call_overhead.py "${CALL[@]}" >"$OUT/call_overhead.log" 2>&1
    note "call overhead (${CALL_OVERHEAD:-quick})" "rc=$? (table in call_overhead.log)"
  fi
  if [ -n "$LIB" ] && [ -z "${SKIP_PEERS:-}" ] && python3 -c 'import torch' 2>/dev/null; then
    # jfa against its peers (quick: W1-W4, fp16, both masks; PEERS_FULL=1: the whole set), every
    # output checked before timing.
    PEERS=(--lib "$LIB" --out "$OUT")
    if [ -n "${PEERS_FULL:-}" ]; then kind="full"; else kind="quick, fp16"; PEERS+=(--quick --name peers); fi
    [ -n "${CLI:-}" ] && PEERS+=(--cli "$CLI")
    PYTHONUNBUFFERED=1 timeout 900 python3 bench/peers.py "${PEERS[@]}" >"$OUT/peers.log" 2>&1
    note "peers ($kind)" "rc=$? (table in peers.log)"
  fi
  if [ -n "$LIB" ] && [ "${BWD_BENCH:-quick}" != off ] && python3 -c 'import torch' 2>/dev/null; then
    # The backward against varlen FA2, FlexAttention, padded cuDNN (and FA3 with FA3_LIB),
    # gradients checked before timing (quick: W1 and W4, fp16, both masks, 3 rounds, the
    # backward; BWD_BENCH=full: W1-W4, the backward and the training step, and the chart).
    # FlexAttention compiles once per workload and mask, which the limits allow for.
    BWD=(--lib "$LIB" --json "$OUT/backward_peers.json")
    if [ "${BWD_BENCH:-quick}" = full ]; then
      kind=full; limit=2400; BWD+=(--pass both --chart "$OUT/backward_peers.png")
    else
      kind=quick; limit=600; BWD+=(--quick)
    fi
    [ -n "${CLI:-}" ] && BWD+=(--cli "$CLI")
    if [ -n "${FA3_LIB:-}" ]; then
      BWD+=(--fa3-lib "$FA3_LIB")
      fa3_runtime
    fi
    PYTHONUNBUFFERED=1 timeout "$limit" python3 bench/backward_peers.py "${BWD[@]}" >"$OUT/backward_peers.log" 2>&1
    note "backward peers ($kind)" "rc=$? (tables in backward_peers.log)"
  fi
fi

{
  echo "==== gpu-check summary ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
  for line in "${SUMMARY[@]}"; do echo "$line"; done
} | tee "$OUT/summary.txt"
