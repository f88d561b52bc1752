#!/usr/bin/env bash
# bwd_local's warp stall reasons (ncu, one launch at 8 x 4096, H 32, D 64, bf16) for each packed binary / setting, so
# that a change's time can be read as which stall it moved (docs/perf/notes.md, v25-v26's outcome). Runs on the GPU
# machine inside the packed binaries (carry third_party_fetched/pre):
#   tools/gpu_prebuilt.sh run "$PWD/tools/local_stalls.sh" "./bench_fwd_<rev>|" "./bench_fwd|VAR=1,VAR2=0" ...
# Each argument: a binary under /tmp/pre and the settings it runs under (comma-joined). Prints, per run, the stall
# reasons above 0.05 warps per issued instruction (smsp__average_warps_issue_stalled_*), instructions, cycles.
set -uo pipefail
OUT=${OUT:-/tmp/local_stalls}; mkdir -p "$OUT"
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for v in "$@"; do
  b=${v%%|*} e=${v#*|}
  log="$OUT/ncu_$(basename "$b")_${e//[^A-Za-z0-9]/_}.txt"
  env ${e//,/ } timeout 150 ncu --clock-control none -k regex:bwd_local --launch-skip 1 --launch-count 1 \
    --metrics "$M,smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum" \
    "$b" --bwd --iters 1 --shape "${STALL_SHAPE:-8,4096,32,64}" > "$log" 2>&1
  echo "== $b ${e:-(default)}: rc=$?"
  grep -E "stalled|inst_executed|cycles_elapsed|issue_active|duration" "$log" |
    awk '{v=$NF; n=$1; sub("smsp__average_warps_issue_stalled_","",n); sub("_per_issue_active.ratio","",n);
          if (v+0 > 0.05 || n ~ /inst|cycles|issue_active|duration/) printf "%s=%s ", n, v} END {print ""}'
done
