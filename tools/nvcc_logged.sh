#!/usr/bin/env bash
# The CUDA compiler launcher of pathattn_core (src/cuda/sources.cmake): runs the compile command (after the first
# argument, LOG_DIR), passes its output through, and keeps its stderr, where ptxas reports each kernel (-Xptxas=-v),
# in LOG_DIR/<object file name>.log. tools/check_ptxas.py reads those reports in the CPU tests (test_ptxas_report):
# ptxas's warnings that it serialised a kernel's wgmma (C7512, C7520) cost 10-16% of the kernel and show nowhere
# else; one such warning went unnoticed from the twenty-ninth session to the thirty-third (docs/perf/notes.md v20).
set -uo pipefail
log_dir=$1
shift
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
mkdir -p "$log_dir"
err=$(mktemp)
"$@" 2> "$err"
rc=$?
cat "$err" >&2
if [ -n "$out" ]; then mv "$err" "$log_dir/$(basename "$out").log"; else rm -f "$err"; fi
exit $rc
