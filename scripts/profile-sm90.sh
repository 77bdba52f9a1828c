#!/usr/bin/env bash
# Nsight Compute profiles of the sm90 forward kernel on benchmark workloads (clocks not locked, so
# the numbers match timed runs). Writes <workload>[-causal].ncu-rep and a text report of each into
# OUTDIR.
#
# usage: scripts/profile-sm90.sh OUTDIR CLI [WORKLOAD[-d64][:causal] ...]   (default: W1 W4)
#   e.g. scripts/profile-sm90.sh /tmp/prof build/release/tools/jfa W1 W1:causal W4 W1-d64
# env:   NCU_SET (default "full"), NCU_DETAIL=1 (also SASS-level stall samples and raw metrics of
#        the last workload as CSV)
set -u -o pipefail
OUT=${1:?usage: scripts/profile-sm90.sh OUTDIR CLI [WORKLOAD[:causal] ...]}
CLI=${2:?usage: scripts/profile-sm90.sh OUTDIR CLI [WORKLOAD[:causal] ...]}
shift 2
mkdir -p "$OUT"
[ $# -gt 0 ] || set -- W1 W4
for spec in "$@"; do
  w=${spec%%:*}
  flags=()
  name=$w
  if [ "$spec" != "$w" ]; then flags+=(--causal); name=$w-causal; fi
  if [ "${w%-d64}" != "$w" ]; then flags+=(--head-dim 64); w=${w%-d64}; fi
  ncu --clock-control none --set "${NCU_SET:-full}" -k regex:fwd_kernel -c 1 -f -o "$OUT/$name" \
    "$CLI" bench --workload "$w" "${flags[@]}" --backend cuda --repeats 1 --warmup 0 --no-padded \
    >"$OUT/$name.log" 2>&1
  echo "$name: ncu rc=$?"
  ncu --import "$OUT/$name.ncu-rep" --page details >"$OUT/$name.txt" 2>&1
done
# Per-instruction stall samples (SASS) and every raw metric of the last report, for reading
# without the GUI.
if [ -n "${NCU_DETAIL:-}" ]; then
  ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass >"$OUT/$name-sass.csv" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page raw --csv >"$OUT/$name-raw.csv" 2>&1
fi
