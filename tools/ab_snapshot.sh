#!/usr/bin/env bash
# Same-run A/B on the GPU against earlier commits. The device machine gets the working tree without git history, so
# the sources that bench_fwd needs at each REV are copied here into third_party_fetched/ab/<short rev> (git-ignored,
# ~1 MB each); a device call carries them (carry: ["third_party_fetched/ab"]) and `tools/gpu_check.sh ab` builds
# bench_fwd from each and times it beside the checkout's own, alternating, in one run (docs/perf/notes.md: compare
# timings only within a run).
#
#   tools/ab_snapshot.sh REV...        e.g. tools/ab_snapshot.sh ca3eb5b 3da78d8
#   tools/ab_snapshot.sh --clear       removes every snapshot
set -euo pipefail
cd "$(dirname "$0")/.."
root=third_party_fetched/ab
if [ "${1:-}" = --clear ]; then rm -rf "$root"; exit 0; fi
[ $# -ge 1 ] || { sed -n '2,9p' "$0"; exit 2; }
for rev in "$@"; do
  short=$(git rev-parse --short=7 "$rev^{commit}")
  dst=$root/$short
  rm -rf "$dst"
  mkdir -p "$dst"
  git archive "$short" CMakeLists.txt include src bench | tar -x -C "$dst"
  echo "$dst: $(git log -1 --format='%h %s' "$short" | cut -c1-100) ($(du -sh "$dst" | cut -f1))"
done
