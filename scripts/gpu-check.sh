#!/usr/bin/env bash
# The GPU checks, in stages that each fit one command of a GPU machine lent for a few minutes at a
# time (each stage ends within about 8 minutes on an H100; the limits below see to it):
#
#   build           on a machine WITHOUT a GPU (nvcc is enough): configure and build the library,
#                   the GPU tests, the CLI and the torch op library, and gather what the other
#                   stages run into CARRY_DIR (default build/gpu-carry), whose size it prints. Also
#                   copies FlashAttention-3's op libraries, still compressed (fa3_varlen.so.xz,
#                   fa3_full_bf16.so.xz: 6 MB, unpacked by the stages that load them), and its
#                   python/ wrapper into .peers/ when FA3_PREBUILT names the folder holding them.
#   suite           the GPU tests (jfa_gpu_tests, in SUITE_SHARDS gtest shards at once on the one
#                   GPU) and the Python tests with torch on CUDA (native ops, then the ctypes ops).
#   sanitize        compute-sanitizer memcheck and racecheck over the reduced case set
#                   (JFA_GPU_TESTS_QUICK=1), both tools and SANITIZER_SHARDS shards at once.
#   bench-forward   jfa against FlashAttention-3 (varlen FA2 and FlexAttention at head_dim 32, where
#                   FA3 has no kernel): every head size, fp16 and bf16, W1-W4, both masks, eager
#                   and CUDA-graph replay, every output checked against a float reference first.
#   bench-backward  the same for the backward op (gradients checked against float64 first).
#   bench-local     the forward with sliding windows, softcap and sinks against FlashAttention-3's
#                   build with windows and softcap (bf16, head_dim 64, 128, 256; sinks jfa alone;
#                   sinks and softcap also against jfa without them),
#                   outputs checked against float64 first (bench/local_peers.py); LOCAL_PASS=backward
#                   the backward op instead (gradients, dsinks too, checked against float64
#                   first), both: the two.
#   bench-paged     jfa's CUDA paged-KV decode forward against FlashAttention-3 and FlashInfer,
#                   bf16, outputs checked against float64 first (bench/paged_peers.py); PAGED_CELLS
#                   its --cells (default decode and spec4; append, chunked prefill's chunk256 and
#                   the u8k cache by name, e.g. chunk256,u4k,u8k), PAGED_METHODS its --methods
#                   (jfa's kernel switches beside jfa: jfa_prefill, jfa_decode, jfa_rows,
#                   jfa_nosplits, jfa_pdl). Not in all.
#   profile-local   Nsight Compute (--set full, clocks not locked) over one jfa and one
#                   FlashAttention-3 call of one local-attention cell (bench/profile_local_pair.py,
#                   PROFILE_ARGS its options, default the backward of W1, head_dim 128, window
#                   4096): pair.ncu-rep, its details as text, its raw metrics as CSV and its
#                   SASS with each instruction's stall samples as CSV. Not in all.
#   profile-paged   the same over one jfa and one FlashAttention-3 call over a paged KV cache
#                   (bench/profile_paged_pair.py, default chunked prefill: 8 sequences of 256
#                   tokens over 4k keys, 32:8, head_dim 128, pages of 16). Not in all.
#   bench           bench-forward, then bench-backward.
#   all             every stage above but build's gathering (builds in place when no CARRY_DIR
#                   exists), for a machine without the per-command limit.
#
# Python peers carried as wheels for the GPU machine's Python (3.12) in .peers/wheels, installed by
# the run stages without a network into .peers/site (put first on PYTHONPATH), each only where that
# Python lacks its distribution, so the machine's own numpy, packaging, ... stay in use:
# - cuDNN's ragged SDPA (bench-backward's cudnn_ragged): `pip download nvidia-cudnn-frontend
#   --no-deps --only-binary=:all: --python-version 3.12 -d .peers/wheels`.
# - FlashInfer (bench-paged's flashinfer), its JIT build (7.5 MB; the AOT builds are over 100 MB, the
#   carry's size), which compiles its kernels on first use with the machine's nvcc:
#   `pip download flashinfer-python==0.6.0 apache-tvm-ffi einops nvidia-ml-py packaging requests
#   certifi charset-normalizer idna urllib3 --no-deps --only-binary=:all: --python-version 3.12
#   --platform manylinux_2_28_x86_64 -d .peers/wheels` (what `import flashinfer` needs beyond torch).
#
# Each stage writes its logs and JSON into OUTDIR and prints one summary line (also appended to
# OUTDIR/summary.txt). Stages after build run only what CARRY_DIR holds: carry it (and .peers for
# the benchmarks) to the GPU machine with the sources.
#
# usage: scripts/gpu-check.sh STAGE OUTDIR
# env:   BUILD_DIR (build: default build/gpu-check; build/release reuses scripts/test.sh's build),
#        CARRY_DIR (default build/gpu-carry), TORCH_DIR (build: the torch package directory to
#        build the op library against; default build/torch-site/torch, else python3's torch),
#        FA3_PREBUILT (build: folder of flash_attn_3_*.so.xz), FA3_LIB (benchmarks: default
#        .peers/fa3_varlen.so), FA3_FULL_LIB (bench-local: default .peers/fa3_full_bf16.so),
#        LOCAL_HEAD_DIMS (bench-local: default "64,128,256"), LOCAL_WORKLOADS and LOCAL_KINDS
#        (bench-local: bench/local_peers.py's --workloads and --kinds), LOCAL_PASS (bench-local:
#        its --pass, forward, backward or both, default forward; the JSON and log are local,
#        local-backward or local-both), LOCAL_PEERS (bench-local: its --peers, default
#        fa3,fa2,flex; fa3,fa2 skips FlexAttention's compiles), SUITE_FILTER (suite: a gtest filter of
#        the GPU tests, default all), SANITIZER_FILTER (sanitize: a gtest filter instead of the
#        reduced case set), SUITE_PYTEST (suite: the pytest paths and options instead
#        of tests/python and the ctypes list; none: the GPU tests alone),
#        SUITE_PYTEST_NATIVE (suite: those of the native
#        ops' run alone), SUITE_SHARDS (default 3), SANITIZER_SHARDS (default 4: racecheck of the
#        paged tests needs them to end within a stage),
#        STAGE_SECONDS (the time a stage plans for, default 450), HEAD_DIMS (benchmarks: default
#        "64 96 128 192 192/128 256 32"), BENCH_ROUNDS (default 2), BENCH_DTYPES (default
#        fp16,bf16), BENCH_WORKLOADS (default "W1 W2 W3 W4"), JFA_METHODS (bench-backward: jfa's
#        methods beside the peers, default jfa; e.g. jfa,jfa_autograd), BACKWARD_PASS
#        (bench-backward: bench/backward_peers.py's --pass, default backward), BACKWARD_HEADS_KV
#        (bench-backward: its --heads-kv, default as many as the query heads)
set -u -o pipefail
STAGE=${1:?usage: scripts/gpu-check.sh build|suite|sanitize|bench-forward|bench-backward|bench-local|bench-paged|profile-local|profile-paged|bench|all OUTDIR}
OUT=${2:?usage: scripts/gpu-check.sh STAGE OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD_DIR:-build/gpu-check}
CARRY=${CARRY_DIR:-build/gpu-carry}
STAGE_SECONDS=${STAGE_SECONDS:-450}
HEAD_DIMS=${HEAD_DIMS:-"64 96 128 192 192/128 256 32"}  # 32 last: its peers compile (FlexAttention)
START=$SECONDS

summary() {  # one line per stage, on stdout and in OUTDIR/summary.txt
  local line
  line="$(printf '%-15s %s (%ds)' "$1" "$2" $((SECONDS - START)))"
  echo "$line" | tee -a "$OUT/summary.txt"
}
left() { echo $((STAGE_SECONDS - (SECONDS - START))); }
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1; }
# The tests gtest passed and failed over LOGs.
gtest_passed() {
  cat "$@" | grep -c '^\[       OK \]'
}
gtest_failed() {
  cat "$@" | grep -c '^\[  FAILED  \].*ms)$'
}
# compute-sanitizer's error count in LOG; "?" where it printed none (cut by a limit, or crashed).
sanitizer_errors() {
  local n
  n=$(grep -Eo '(ERROR|RACECHECK) SUMMARY: [0-9]+' "$1" | grep -Eo '[0-9]+$' | tail -1)
  echo "${n:-?}"
}

# What the run stages need on the GPU machine: the carried libraries first on the loader's path,
# then the CUDA runtime of the toolkit and of torch's wheels (FlashAttention-3's library and the CLI
# link it dynamically).
runtime_env() {
  [ -d "$CARRY" ] || { echo "no $CARRY: run 'scripts/gpu-check.sh build' first and carry it" >&2; return 1; }
  CARRY=$(cd "$CARRY" && pwd)
  unpack_carry
  local libs="$CARRY/lib" cudart
  [ -d /usr/local/cuda/lib64 ] && libs="$libs:/usr/local/cuda/lib64"
  cudart=$(python3 -c 'import glob, site; print(next(iter(sorted(glob.glob(site.getsitepackages()[0] + "/nvidia/**/libcudart.so.*", recursive=True))), "").rpartition("/")[0])' 2>/dev/null)
  [ -n "$cudart" ] && libs="$libs:$cudart"
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export JFA_LIBRARY="$CARRY/lib/libjfa.so" PYTHONUNBUFFERED=1
  export FA3_LIB=${FA3_LIB:-$ROOT/.peers/fa3_varlen.so}
  export FA3_FULL_LIB=${FA3_FULL_LIB:-$ROOT/.peers/fa3_full_bf16.so}
  [ -d "$ROOT/.peers/python" ] && export PYTHONPATH="$ROOT/.peers/python${PYTHONPATH:+:$PYTHONPATH}"
  install_carried_wheels
  return 0
}

# The carried binaries and FA3's libraries, carried xz-compressed (stage_build; 26 MB and 68 MB as
# about 2.1 and 6), unpacked beside their .xz once, under a lock (stages run side by side), with
# their modes.
unpack_carry() {
  (
    flock 9
    for packed in "$CARRY"/lib/*.xz "$CARRY"/bin/*.xz "$ROOT"/.peers/*.so.xz; do
      [ -f "$packed" ] && [ ! -f "${packed%.xz}" ] && xz -dk "$packed"
    done
    exit 0
  ) 9>"$CARRY/.unpack.lock"
}

# The wheels in .peers/wheels into .peers/site (once), each only where python3 lacks its
# distribution; .peers/site first on PYTHONPATH.
install_carried_wheels() {
  local site="$ROOT/.peers/site"
  [ -d "$ROOT/.peers/wheels" ] || return 0
  (  # stages run side by side: one installs, the others wait for it
    flock 9
    [ -f "$site/.installed" ] && exit 0
    missing=()
    for wheel in "$ROOT"/.peers/wheels/*.whl; do
      name=$(basename "$wheel")
      python3 -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "${name%%-*}" \
        2>/dev/null || missing+=("$wheel")
    done
    [ ${#missing[@]} -eq 0 ] ||
      python3 -m pip install -q --no-deps --no-index --target "$site" "${missing[@]}" \
        >"$OUT/carried-wheels.log" 2>&1
    mkdir -p "$site" && touch "$site/.installed"
  ) 9>"$ROOT/.peers/site.lock"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}

stage_build() {
  local torch_dir=${TORCH_DIR:-}
  [ -z "$torch_dir" ] && [ -d build/torch-site/torch ] && torch_dir=$PWD/build/torch-site/torch
  [ -z "$torch_dir" ] && torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
  local torch_flag=(-DJFA_TORCH_OPS=OFF)
  [ -d "$torch_dir/include" ] && torch_flag=(-DJFA_TORCH_OPS=ON "-DJFA_TORCH_DIR=$torch_dir")
  echo "build: configuring $BUILD (sm_90a kernels take several minutes on 2 cores; log in $OUT/build.log)"
  if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DJFA_BUILD_TOOLS=ON \
           -DJFA_BUILD_TESTS=ON -DJFA_BUILD_BENCH=OFF "${torch_flag[@]}" &&
         cmake --build "$BUILD" -j"$(nproc)" --target jfa_lib jfa_gpu_tests jfa_cli \
           $([ -d "$torch_dir/include" ] && echo jfa_torch); } >"$OUT/build.log" 2>&1; then
    summary build "FAILED (see build.log)"
    return 1
  fi
  rm -rf "$CARRY" && mkdir -p "$CARRY/lib" "$CARRY/bin"
  # The real file under its soname, libjfa.so a link beside it (links inside a carried folder
  # travel as links); binaries stripped of symbols to keep the carried size down.
  local real soname
  real=$(readlink -f "$BUILD/src/libjfa.so")
  soname=$(objdump -p "$real" | awk '/SONAME/ {print $2}')
  cp "$real" "$CARRY/lib/${soname:-libjfa.so}"
  [ -n "$soname" ] && [ "$soname" != libjfa.so ] && ln -s "$soname" "$CARRY/lib/libjfa.so"
  [ -f "$BUILD/src/libjfa_torch.so" ] && cp "$BUILD/src/libjfa_torch.so" "$CARRY/lib/"
  cp "$(find "$BUILD" -name jfa_gpu_tests -type f | head -1)" "$CARRY/bin/"
  cp "$BUILD/tools/jfa" "$CARRY/bin/"
  strip --strip-unneeded "$CARRY"/lib/*.so* "$CARRY"/bin/* 2>/dev/null
  # Carried xz-compressed (the kernels' machine code repeats itself: 26 MB of binaries carry as
  # about 2.5), so that the FlashInfer and cuDNN wheels or a second build fit beside them;
  # runtime_env unpacks them. Links stay links.
  local f
  for f in "$CARRY"/lib/* "$CARRY"/bin/*; do
    [ -L "$f" ] || xz -T0 -6 "$f"
  done
  local fa3=""
  if [ -n "${FA3_PREBUILT:-}" ] && [ -f "$FA3_PREBUILT/flash_attn_3_varlen.so.xz" ]; then
    # FA3's files anew; carried wheels (.peers/wheels) stay.
    rm -rf .peers/fa3_*.so* .peers/python && mkdir -p .peers
    local lib
    for lib in varlen full_bf16; do
      [ -f "$FA3_PREBUILT/flash_attn_3_$lib.so.xz" ] &&
        cp "$FA3_PREBUILT/flash_attn_3_$lib.so.xz" ".peers/fa3_$lib.so.xz"
    done
    [ -d "$FA3_PREBUILT/python" ] && cp -r "$FA3_PREBUILT/python" .peers/python
    chmod -R u+w .peers
    fa3=", .peers $(du -sh .peers | cut -f1)"
  fi
  summary build "ok: carry $CARRY ($(du -sh "$CARRY" | cut -f1)$fa3; torch ops: $([ -f "$CARRY/lib/libjfa_torch.so.xz" ] && echo built || echo 'not built, no torch'))"
}

stage_suite() {
  runtime_env || { summary suite "FAILED (nothing carried)"; return 1; }
  local shards=${SUITE_SHARDS:-3} budget i pids=() rc_gpu=0
  budget=$(left)
  # gtest shards of the GPU tests side by side on the one GPU, and the Python tests beside them.
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$budget" "$CARRY/bin/jfa_gpu_tests" \
      --gtest_filter="${SUITE_FILTER:-*}" >"$OUT/gpu_tests_shard$i.log" 2>&1 &
    pids+=($!)
  done
  local pytest_native pytest_ctypes passed failed
  if [ "${SUITE_PYTEST:-}" = none ]; then  # the GPU tests alone
    for pid in "${pids[@]}"; do wait "$pid" || rc_gpu=1; done
    passed=$(gtest_passed "$OUT"/gpu_tests_shard*.log)
    failed=$(gtest_failed "$OUT"/gpu_tests_shard*.log)
    summary suite "$(gpu_name): jfa_gpu_tests $passed passed, $failed failed (rc $rc_gpu,\
 $shards shards); pytest: not run (SUITE_PYTEST=none)"
    return $rc_gpu
  fi
  local native=(tests/python) ctypes=(tests/python/test_torch.py
    tests/python/test_torch_cuda_backward.py tests/python/test_torch_cuda_graph_backward.py
    tests/python/test_torch_local_attention.py tests/python/test_readme.py)
  [ -n "${SUITE_PYTEST:-}" ] && native=($SUITE_PYTEST) && ctypes=($SUITE_PYTEST)
  [ -n "${SUITE_PYTEST_NATIVE:-}" ] && native=($SUITE_PYTEST_NATIVE)
  (timeout $((budget * 2 / 3)) python3 -m pytest "${native[@]}" -q -rs -p no:cacheprovider \
     >"$OUT/pytest.log" 2>&1; echo $? >"$OUT/pytest.rc") &
  local ppid=$!
  for pid in "${pids[@]}"; do wait "$pid" || rc_gpu=1; done
  wait $ppid
  JFA_TORCH_OPS=ctypes timeout "$(left)" python3 -m pytest "${ctypes[@]}" -q -rs \
    -p no:cacheprovider >"$OUT/pytest_ctypes.log" 2>&1
  echo $? >"$OUT/pytest_ctypes.rc"
  passed=$(gtest_passed "$OUT"/gpu_tests_shard*.log)
  failed=$(gtest_failed "$OUT"/gpu_tests_shard*.log)
  pytest_native="$(tail -1 "$OUT/pytest.log") rc=$(cat "$OUT/pytest.rc")"
  pytest_ctypes="$(tail -1 "$OUT/pytest_ctypes.log") rc=$(cat "$OUT/pytest_ctypes.rc")"
  summary suite "$(gpu_name): jfa_gpu_tests $passed passed, $failed failed (rc $rc_gpu, $shards shards); pytest: $pytest_native; ctypes ops: $pytest_ctypes"
  [ "$rc_gpu" = 0 ] && [ "$(cat "$OUT/pytest.rc")" = 0 ] && [ "$(cat "$OUT/pytest_ctypes.rc")" = 0 ]
}

# The reduced case set: the tile layer, every edge of the offsets, shared tiles, workspaces,
# the checked mode, both passes.
DEFAULT_SANITIZER_FILTER='TlxTma.*:TlxMBarrier.*:TlxWgmma.Fp16D128N128:AttentionGpu.OtherLaunchChoicesMatchReference:AttentionGpu.EdgeLengths*:AttentionGpu.DifferentQueryAndKeyLengthsGqa:AttentionGpu.GarbageDeviceOffsetsStayInBounds:AttentionGpu.CheckedModeReportsInvalidDeviceOffsets:AttentionGpu.CheckedModeReportsResultsBeyondFloat32:AttentionGpu.NoKeysAnywhere:AttentionGpu.ManyTinySequences:AttentionGpu.AlternativeSchedulesMatchReference:AttentionGpu.ShortSequencesShareTiles:AttentionGpuApi.CallerWorkspace:AttentionGpuApi.KeptWorkspaceGrows:BackwardGpu.EdgeLengths*:BackwardGpu.CrossLengthsGqa:BackwardGpu.EmptySequences:BackwardGpu.ManyTinySequences:BackwardGpu.SharedTilesOfShortSequences:BackwardGpu.DeterministicSharedTiles:BackwardGpuApi.StaleWorkspaceDoesNotReachSharedTiles:BackwardGpu.StridedGradientLayouts:BackwardGpu.DeterministicRunsAreBitIdentical:BackwardGpuApi.CallerWorkspaceGivesTheSameGradients:BackwardGpuApi.CheckedModeReportsInvalidDeviceOffsets:BackwardGpuApi.CheckedModeReportsGradientsThatAreNotFinite:AttentionGpu.LocalAttentionMatchesReference:AttentionGpu.LocalAttentionCallerWorkspaceAndCheckedMode:BackwardGpu.LocalAttentionMatchesReference:PagedGpu.*:PagedGpu/*'
SANITIZER_FILTER=${SANITIZER_FILTER:-$DEFAULT_SANITIZER_FILTER}

stage_sanitize() {
  runtime_env || { summary sanitize "FAILED (nothing carried)"; return 1; }
  command -v compute-sanitizer >/dev/null || { summary sanitize "FAILED (no compute-sanitizer)"; return 1; }
  local shards=${SANITIZER_SHARDS:-4} budget tool i pids=() words=() rc=0
  budget=$(left)
  for tool in memcheck racecheck; do
    for ((i = 0; i < shards; i++)); do
      JFA_GPU_TESTS_QUICK=1 GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$budget" \
        compute-sanitizer --tool "$tool" --error-exitcode 99 "$CARRY/bin/jfa_gpu_tests" \
        --gtest_filter="$SANITIZER_FILTER" >"$OUT/$tool.shard$i.log" 2>&1 &
      pids+=($!)
    done
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for tool in memcheck racecheck; do
    local errors=0 tests=0 n
    for ((i = 0; i < shards; i++)); do
      n=$(sanitizer_errors "$OUT/$tool.shard$i.log")
      [ "$n" = "?" ] && rc=1
      [ "$n" != "?" ] && errors=$((errors + n))
      tests=$((tests + $(gtest_passed "$OUT/$tool.shard$i.log")))
    done
    words+=("$tool $errors errors over $tests tests")
  done
  summary sanitize "$(gpu_name): ${words[0]}; ${words[1]} (rc $rc)"
  return $rc
}

# The benchmarks time one head size per process, each within its share of what is left.
bench_peers_for() {  # the peers at one head size: FA3 where it has a kernel
  case $1 in
    32) echo "${2},fa2_varlen,flex" ;;
    *) echo "${2},fa3" ;;
  esac
}

workloads_at() {  # bench/workloads.py's names at a head size: W1 (128), W1-d64, W1-d192v128, ...
  local suffix w list=()
  case $1 in 128) suffix="" ;; */*) suffix="-d${1/\//v}" ;; *) suffix="-d$1" ;; esac
  for w in ${BENCH_WORKLOADS:-W1 W2 W3 W4}; do list+=("$w$suffix"); done
  (IFS=,; echo "${list[*]}")
}

stage_bench_forward() {
  runtime_env || { summary bench-forward "FAILED (nothing carried)"; return 1; }
  local dims=($HEAD_DIMS) n=0 done_dims=() d rc=0 share workloads
  for d in "${dims[@]}"; do
    share=$(($(left) / (${#dims[@]} - n)))
    n=$((n + 1))
    [ "$share" -lt 20 ] && break
    workloads=$(workloads_at "$d")
    timeout "$share" python3 bench/peers.py --lib "$JFA_LIBRARY" --cli "$CARRY/bin/jfa" \
      --fa3-lib "$FA3_LIB" --out "$OUT" --name "forward-d${d/\//v}" --workloads "$workloads" \
      --dtypes "${BENCH_DTYPES:-fp16,bf16}" --methods "$(bench_peers_for "$d" jfa)" \
      --rounds "${BENCH_ROUNDS:-2}" --quick >"$OUT/forward-d${d/\//v}.log" 2>&1 || rc=1
    done_dims+=("$d")
  done
  summary bench-forward "$(gpu_name): head sizes ${done_dims[*]} (rc $rc; forward-d*.json, tables in forward-d*.log)"
  return $rc
}

stage_bench_backward() {
  runtime_env || { summary bench-backward "FAILED (nothing carried)"; return 1; }
  local dims=() n=0 done_dims=() d rc=0 share
  for d in $HEAD_DIMS; do [ "$d" = 192/128 ] || dims+=("$d"); done  # no backward peer at 192/128
  for d in "${dims[@]}"; do
    share=$(($(left) / (${#dims[@]} - n)))
    n=$((n + 1))
    [ "$share" -lt 20 ] && break
    timeout "$share" python3 bench/backward_peers.py --lib "$JFA_LIBRARY" --cli "$CARRY/bin/jfa" \
      --fa3-lib "$FA3_LIB" --head-dim "$d" --workloads "$(workloads_at 128)" \
      --dtypes "${BENCH_DTYPES:-fp16,bf16}" --methods "$(bench_peers_for "$d" "${JFA_METHODS:-jfa}")" \
      --pass "${BACKWARD_PASS:-backward}" ${BACKWARD_HEADS_KV:+--heads-kv "$BACKWARD_HEADS_KV"} \
      --rounds "${BENCH_ROUNDS:-2}" --quick --json "$OUT/backward-d$d.json" \
      >"$OUT/backward-d$d.log" 2>&1 || rc=1
    done_dims+=("$d")
  done
  summary bench-backward "$(gpu_name): head sizes ${done_dims[*]} (rc $rc; backward-d*.json and .log)"
  return $rc
}

stage_bench_local() {
  runtime_env || { summary bench-local "FAILED (nothing carried)"; return 1; }
  local rc=0 pass=${LOCAL_PASS:-forward} name=local
  [ "$pass" = forward ] || name=local-$pass
  timeout "$(left)" python3 bench/local_peers.py --lib "$JFA_LIBRARY" --fa3-lib "$FA3_FULL_LIB" \
    --out "$OUT" --name "$name" --pass "$pass" --head-dims "${LOCAL_HEAD_DIMS:-64,128,256}" \
    ${LOCAL_WORKLOADS:+--workloads "$LOCAL_WORKLOADS"} ${LOCAL_KINDS:+--kinds "$LOCAL_KINDS"} \
    ${LOCAL_PEERS:+--peers "$LOCAL_PEERS"} \
    --rounds "${BENCH_ROUNDS:-2}" --time-limit-s $(($(left) - 30)) >"$OUT/$name.log" 2>&1 || rc=1
  summary bench-local "$(gpu_name): $pass, rc $rc ($name.json, table in $name.log)"
  return $rc
}

stage_bench_paged() {
  runtime_env || { summary bench-paged "FAILED (nothing carried)"; return 1; }
  local rc=0
  timeout "$(left)" python3 bench/paged_peers.py --lib "$JFA_LIBRARY" --fa3-lib "$FA3_FULL_LIB" \
    --out "$OUT" --name paged ${PAGED_CELLS:+--cells "$PAGED_CELLS"} \
    ${PAGED_METHODS:+--methods "$PAGED_METHODS"} \
    --rounds "${BENCH_ROUNDS:-2}" --time-limit-s $(($(left) - 30)) >"$OUT/paged.log" 2>&1 || rc=1
  summary bench-paged "$(gpu_name): rc $rc (paged.json, table in paged.log)"
  return $rc
}

# profile_pair STAGE SCRIPT DEFAULT_ARGS: Nsight Compute over SCRIPT's jfa and FlashAttention-3
# calls (FA3's full build: windows, softcap, paged KV), PROFILE_ARGS instead of DEFAULT_ARGS.
profile_pair() {
  local stage=$1 script=$2 defaults=$3 rc=0
  runtime_env || { summary "$stage" "FAILED (nothing carried)"; return 1; }
  command -v ncu >/dev/null || { summary "$stage" "FAILED (no ncu)"; return 1; }
  # shellcheck disable=SC2086  # PROFILE_ARGS is a list of options
  FA3_LIB=$FA3_FULL_LIB timeout "$(left)" ncu --profile-from-start off --clock-control none \
    --set "${NCU_SET:-full}" -f -o "$OUT/pair" python3 "$script" \
    ${PROFILE_ARGS:-$defaults} >"$OUT/profile.log" 2>&1 || rc=1
  ncu --import "$OUT/pair.ncu-rep" --page details >"$OUT/pair.txt" 2>&1
  ncu --import "$OUT/pair.ncu-rep" --page raw --csv >"$OUT/pair-raw.csv" 2>&1
  # Per SASS instruction: its stall samples, to say where the cycles go (the details page has only
  # the kernel's totals).
  ncu --import "$OUT/pair.ncu-rep" --page source --print-source sass --csv >"$OUT/pair-sass.csv" 2>&1
  summary "$stage" "$(gpu_name): rc $rc ($(grep -c '^  [a-zA-Z_].*(' "$OUT/pair.txt") kernels in pair.txt)"
  return $rc
}

case $STAGE in
  build) stage_build ;;
  suite) stage_suite ;;
  sanitize) stage_sanitize ;;
  bench-forward) stage_bench_forward ;;
  bench-backward) stage_bench_backward ;;
  bench-local) stage_bench_local ;;
  bench-paged) stage_bench_paged ;;
  profile-local)
    profile_pair profile-local bench/profile_local_pair.py "--pass backward --head-dim 128 --window 4096" ;;
  profile-paged)
    profile_pair profile-paged bench/profile_paged_pair.py "--batch 8 --tokens 256 --cache 4096" ;;
  bench)
    STAGE_SECONDS=$((STAGE_SECONDS / 2)) stage_bench_forward; a=$?
    START=$SECONDS stage_bench_backward; b=$?
    exit $((a | b)) ;;
  all)
    rc=0
    [ -d "$CARRY" ] || stage_build || exit 1
    for s in stage_suite stage_sanitize stage_bench_forward stage_bench_backward stage_bench_local; do
      START=$SECONDS STAGE_SECONDS=100000 $s || rc=1
    done
    exit $rc ;;
  *) echo "unknown stage '$STAGE' (build, suite, sanitize, bench-forward, bench-backward, bench-local, bench-paged, profile-local, profile-paged, bench, all)" >&2
     exit 2 ;;
esac
