# pack_out TAG: every file of $OUT but summary.txt, ncu reports and earlier archives into one archive,
# $OUT/logs-TAG-<time>.tgz (untar it where the files came back). Sourced by tools/gpu_check.sh and
# tools/gpu_prebuilt.sh, which call it on exit. Why: a device call brings back at most 8 of $OUT's files (and only
# the last 12,000 characters of its output); with more than 8 there, summary.txt itself was left out (twenty-fifth
# session: localprof's leave-one-out times were lost; fortieth: the check's sanitizer logs and summary).
# GPU_CHECK_PACK=0 leaves the files as they are.
pack_out() {
  [ "${GPU_CHECK_PACK:-1}" = 1 ] || return 0
  local name files
  name=logs-$1-$(date +%H%M%S).tgz
  mapfile -t files < <(cd "$OUT" && find . -maxdepth 1 -type f ! -name summary.txt ! -name '*.tgz' ! -name '*.ncu-rep' \
                         -printf '%f\n' | sort)
  [ ${#files[@]} -gt 0 ] || return 0
  tar czf "$OUT/$name" -C "$OUT" "${files[@]}" && (cd "$OUT" && rm -f "${files[@]}")
  echo "pack_out: ${#files[@]} files of \$OUT packed into $name (summary.txt kept beside it)"
}
