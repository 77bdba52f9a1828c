#!/usr/bin/env bash
# Fuzzes the C ABI (tests/fuzz/attention_fuzzer.cpp: libFuzzer, ASan and UBSan, the CPU backend)
# for SECONDS, starting from the committed corpus; new inputs go to a scratch directory, a
# failing input to build/fuzz/. Exits non-zero on any finding.
#
# usage: scripts/fuzz.sh [SECONDS]   (default 120)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"$(nproc)" --target jfa_attention_fuzzer >/dev/null
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# One thread per call: the harness is about arguments, and sanitized threads are slow.
JFA_NUM_THREADS=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  build/fuzz/tests/fuzz/jfa_attention_fuzzer "$scratch" tests/fuzz/corpus \
  -max_total_time="$seconds" -max_len=512 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=build/fuzz/ 2>&1 | grep -E "^stat::|^Done|ERROR|runtime error|SUMMARY|property"
