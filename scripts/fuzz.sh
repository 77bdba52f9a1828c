#!/usr/bin/env bash
# Fuzzes the C ABI (tests/fuzz/attention_fuzzer.cpp: libFuzzer, ASan and UBSan, the CPU backend)
# for SECONDS, starting from the committed corpus; new inputs go to a scratch directory, a
# failing input to build/fuzz/. Exits non-zero on any finding. Prints libFuzzer's latest status
# every 15 s while it runs (its full output: build/fuzz/fuzz.log).
#
# usage: scripts/fuzz.sh [SECONDS]   (default 120)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}
echo "fuzz: building the harness (clang, ASan + UBSan; about 20 s on 2 cores the first time)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"$(nproc)" --target jfa_attention_fuzzer >build/fuzz/build.log 2>&1 ||
  { tail -n 40 build/fuzz/build.log; echo "fuzz: the build failed (build/fuzz/build.log)"; exit 1; }
scratch=$(mktemp -d)
log=build/fuzz/fuzz.log
: >"$log"
heartbeat=""
trap '[ -z "$heartbeat" ] || kill "$heartbeat" 2>/dev/null; rm -rf "$scratch"' EXIT
echo "fuzz: running for $seconds s from tests/fuzz/corpus"
# libFuzzer's own status lines come at doubling run counts, so minutes can pass between them.
(
  start=$(date +%s)
  # wait, unlike a foreground sleep, lets the trap run at once and take its sleep along.
  trap 'kill $! 2>/dev/null; exit 0' TERM
  while :; do
    sleep 15 &
    wait $!
    last=$(grep -a -E '^#[0-9]+' "$log" | tail -n 1 || true)
    echo "fuzz: $(($(date +%s) - start)) s of $seconds s${last:+; $last}"
  done
) &
heartbeat=$!
# One thread per call: the harness is about arguments, and sanitized threads are slow.
JFA_NUM_THREADS=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  build/fuzz/tests/fuzz/jfa_attention_fuzzer "$scratch" tests/fuzz/corpus \
  -max_total_time="$seconds" -max_len=512 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=build/fuzz/ 2>&1 | tee "$log" |
  grep --line-buffered -E "^stat::|^Done|ERROR|runtime error|SUMMARY|property" ||
  { rc=$?; echo "fuzz: failed (exit $rc); libFuzzer's full output: $log"; exit "$rc"; }
