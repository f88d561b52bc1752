#!/usr/bin/env bash
# A device call without the build: the GPU binaries built here (sm_90a runs as is on the GPU machine, HOPPER.md) and
# the shared libraries the GPU image lacks, packed into one git-ignored archive that the call carries. For a call
# whose device time is short: a fresh machine's build takes ~110 s of gpu_check.sh's time (docs/perf/notes.md, "Next
# device calls"), the archive ~3 s to unpack. Nothing here replaces gpu_check.sh's full checks (sanitizers, every gpu
# test, the torch extension): it runs what the binaries can.
#
#   tools/gpu_prebuilt.sh pack [TARGETS...]   here: builds TARGETS in build/ (default: bench_fwd test_cuda_backward;
#                                             build/ from tools/setup.sh, CUDA on), strips them, adds OpenBLAS and the
#                                             runtime libraries it pulls in (the GPU image has none), and writes
#                                             third_party_fetched/pre/pre.tar.xz (~20 MB; a call carries at most 64 MiB).
#                                             PRE_BASE="REV...": also bench_fwd built from each REV's sources
#                                             (tools/ab_snapshot.sh, in build-ab-<rev>), packed as bench_fwd_<rev>, for
#                                             check's A/B; PRE_KEEP_BASE=1: the replaced archive's bench_fwd (and its
#                                             bases) packed again as bench_fwd_<its commit>, without a rebuild
#   tools/gpu_prebuilt.sh run CMD...          on the GPU machine (carry third_party_fetched/pre): unpacks to /tmp/pre
#                                             and runs CMD there with the libraries on LD_LIBRARY_PATH, e.g.
#                                             tools/gpu_prebuilt.sh run ./bench_fwd --bwd --shape 32,4096,32,64
#   tools/gpu_prebuilt.sh check               on the GPU machine: the check of a backward change made without a GPU
#                                             (docs/perf/notes.md "Next device calls"): memcheck and racecheck on small
#                                             cases and the case table (not Long), each case's errors against the
#                                             recorded commit's (docs/perf/errors_bwd_*.txt), per chunk and with blocks
#                                             of 2; then the A/B, bench_fwd --bwd with stage times (CHECK_BENCH_ARGS,
#                                             default --only 64 --iters 5), the packed bases and this build alternating
#                                             (this build under each of CHECK_ENVS instead, e.g. "X=0 X=1 X=1,Y=1",
#                                             a comma joining the variables of one setting, if set),
#                                             CHECK_ROUNDS (2) rounds; logs to $OUT. CHECK_TEST_ENV: the sanitizers and the
#                                             case table run under it too (e.g. the switch the A/B is about);
#                                             CHECK_LEAN=1: the sanitizers on one small D = 64 case and no blocks-of-2
#                                             pass (~100 s of command for three binaries, two rounds). With
#                                             test_cuda_forward packed, its case table and sanitizers run first (and
#                                             before them test_cuda_wgmma_tf32 with the sanitizers, when packed). Logs
#                                             go to $OUT as one archive beside summary.txt (tools/out_pack.sh)
#
# The binaries are built with -march=native (pathattn_core's CPU path, test_cuda_backward's reference): the GPU
# machine's CPU must have this machine's instruction set (both AVX-512 so far); a SIGILL (rc 132) says it does not.
set -uo pipefail
cd "$(dirname "$0")/.."
CMD=${1:-}; shift || true
ARCHIVE=third_party_fetched/pre/pre.tar.xz

case "$CMD" in
  pack)
    targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(bench_fwd test_cuda_backward)
    cmake --build build --target "${targets[@]}" -j"$(nproc)" > /tmp/gpu_prebuilt_build.log 2>&1 ||
      { tail -20 /tmp/gpu_prebuilt_build.log; exit 1; }
    stage=$(mktemp -d)
    mkdir -p "$stage/lib"
    for rev in ${PRE_BASE:-}; do
      base=$(git rev-parse --short=7 "$rev^{commit}") || exit 1
      [ -f "third_party_fetched/ab/$base/CMakeLists.txt" ] || tools/ab_snapshot.sh "$base" || exit 1
      { cmake -S "third_party_fetched/ab/$base" -B "build-ab-$base" -DPATHATTN_TORCH=OFF -DPATHATTN_CUDA=ON \
          -DPATHATTN_TESTS=OFF -DPATHATTN_BENCH=ON -DCMAKE_BUILD_TYPE=Release \
          -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" &&
        cmake --build "build-ab-$base" --target bench_fwd -j"$(nproc)"; } > /tmp/gpu_prebuilt_base.log 2>&1 ||
        { tail -20 /tmp/gpu_prebuilt_base.log; exit 1; }
      cp "build-ab-$base/bench/cuda/bench_fwd" "$stage/bench_fwd_$base" && strip "$stage/bench_fwd_$base"
    done
    # PRE_KEEP_BASE=1: the archive being replaced keeps serving as a base: its bench_fwd becomes bench_fwd_<its
    # head.txt> here (no rebuild of the last measured build when the next change is A/B'd against it).
    if [ "${PRE_KEEP_BASE:-0}" = 1 ] && [ -f "$ARCHIVE" ]; then
      old=$(tar -xJOf "$ARCHIVE" ./head.txt | head -c 7)
      tar -xJOf "$ARCHIVE" ./bench_fwd > "$stage/bench_fwd_$old" && chmod +x "$stage/bench_fwd_$old" || exit 1
      tar -tJf "$ARCHIVE" | grep -E '^\./bench_fwd_' | while read -r f; do  # and its own bases
        [ -e "$stage/$f" ] || { tar -xJOf "$ARCHIVE" "$f" > "$stage/$f" && chmod +x "$stage/$f"; }
      done
    fi
    git rev-parse --short=7 HEAD > "$stage/head.txt"  # (the working tree's commit; uncommitted edits are not named)
    for t in "${targets[@]}"; do
      bin=$(find build -type f -name "$t" -perm -u+x | head -1)
      [ -n "$bin" ] || { echo "gpu_prebuilt: no built $t under build/"; exit 1; }
      cp "$bin" "$stage/" && strip "$stage/$t"
      # The libraries outside glibc, libstdc++ and CUDA's runtime (the GPU image has those): OpenBLAS and what it
      # links (gfortran, quadmath, OpenMP).
      ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'openblas|gfortran|quadmath|gomp' | while read -r lib; do
        cp -Ln "$lib" "$stage/lib/"
      done
    done
    mkdir -p "$(dirname "$ARCHIVE")"
    tar -C "$stage" -cJf "$ARCHIVE" . && rm -rf "$stage"
    echo "gpu_prebuilt: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1)): ${targets[*]}${PRE_BASE:+, bench_fwd of $PRE_BASE} and $(tar -tJf "$ARCHIVE" | grep -c '^./lib/.') libraries"
    ;;
  run|check)
    [ -f "$ARCHIVE" ] || { echo "gpu_prebuilt: no $ARCHIVE (pack it here and carry third_party_fetched/pre)"; exit 1; }
    rm -rf /tmp/pre && mkdir -p /tmp/pre && tar -C /tmp/pre -xJf "$ARCHIVE" || exit 1
    export LD_LIBRARY_PATH=/tmp/pre/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    OUT=${OUT:-/tmp/gpu_prebuilt_out}; mkdir -p "$OUT"
    if [ "$CMD" = run ]; then
      cd /tmp/pre && exec "$@"
    fi
    ROOT=$PWD  # (the repository: the script starts there)
    say() { echo "$*" | tee -a "$OUT/summary.txt"; }  # (printed as it goes: a call cut short still shows it)
    . "$ROOT/tools/out_pack.sh"; trap 'pack_out check' EXIT  # a call brings back 8 files: the logs as one archive
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    cd /tmp/pre
    # Memcheck and racecheck on small cases (both D; gpu_check.sh's SMALL_BWD64 and its D = 128 case) and the case
    # table (not Long), each case's errors against the recorded commit's: the same digits when the change keeps the
    # bits. Per chunk and with blocks of 2 (the two-level sums).
    # CHECK_LEAN=1 (a call with little device time left): the sanitizers on one D = 64 case, per chunk only.
    san_cases='*B1_T65_H1_HQ4_D64_DV64_betauniform_gate_bf16:*T331_H2_HQ4_D64*varlen7_bf16:*B2_T200_H2_HQ2_D64*:*B2_T65_H2_HQ2_D128_DV128_betauniform_f16'
    envs=("${CHECK_TEST_ENV:-}" "PATHATTN_BWD_BLOCK=2${CHECK_TEST_ENV:+ $CHECK_TEST_ENV}")
    if [ "${CHECK_LEAN:-0}" = 1 ]; then san_cases='*B2_T200_H2_HQ2_D64*'; envs=("${CHECK_TEST_ENV:-}"); fi
    # sanitize_and_table BINARY TAG ENV CASES: memcheck and racecheck on CASES, then the case table (not Long) into
    # $OUT/errors_<TAG>.log.
    sanitize_and_table() {
      local bin=$1 tag=$2 v=$3 cases=$4 tool
      for tool in memcheck racecheck; do
        env $v timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 "$bin" --gtest_filter="$cases" \
          > "$OUT/sanitizer_${tag}_$tool.log" 2>&1
        say "compute-sanitizer $tool ($tag): rc=$?, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_${tag}_$tool.log" | tail -1)"
      done
      env $v timeout 100 "$bin" --gtest_filter=-Long/* > "$OUT/errors_$tag.log" 2>&1
      say "$(basename "$bin") ($tag): rc=$?, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/errors_$tag.log" | tr '\n' ' ')"
    }
    # The TF32 wgmma primitive's test when packed (`pack ... test_cuda_wgmma_tf32`): what preprocess v8 builds on.
    [ -x ./test_cuda_wgmma_tf32 ] && sanitize_and_table ./test_cuda_wgmma_tf32 wgmma_tf32 "" '*'
    # The forward's too when its test binary is packed (`pack bench_fwd test_cuda_forward test_cuda_backward`): a
    # change to what both directions run (the preprocess) is checked by both (gpu_check.sh's small forward cases).
    if [ -x ./test_cuda_forward ]; then
      sanitize_and_table ./test_cuda_forward fwd "${CHECK_TEST_ENV:-}" \
        '*B1_T65_H1_HQ4_D64_DV64_betauniform_gate_bf16:*T331_H2_HQ4_D64*varlen7_bf16:*B2_T65_H2_HQ2_D128_DV128_betauniform_f16:CudaSupport.*'
    fi
    for v in "${envs[@]}"; do
      case "$v" in *BLOCK=2*) tag=bwd_default_block2 ;; *) tag=bwd_default ;; esac
      sanitize_and_table ./test_cuda_backward "$tag" "$v" "$san_cases"
      for ref in "$ROOT"/docs/perf/errors_bwd_*.txt; do
        say "($tag) $(python3 "$ROOT/tools/same_errors.py" "$OUT/errors_$tag.log" "$ref")"
      done
    done
    # The A/B: the packed bases (pack with PRE_BASE) and this build, alternating (compare timings only within a run);
    # CHECK_ENVS="A=0 A=1 ...": this build under each setting instead of once as it comes (an opt-in switch A/B'd
    # in one binary; name the default among them).
    bins=(./bench_fwd_*); [ -e "${bins[0]}" ] || bins=()
    runs=(); for b in "${bins[@]}"; do runs+=("$b|"); done
    if [ -n "${CHECK_ENVS:-}" ]; then for e in $CHECK_ENVS; do runs+=("./bench_fwd|$e"); done; else runs+=("./bench_fwd|"); fi
    say "A/B: ${runs[*]} (./bench_fwd is $(cat head.txt 2>/dev/null || echo 'this build'))"
    for round in $(seq "${CHECK_ROUNDS:-2}"); do
      for run in "${runs[@]}"; do
        b=${run%%|*} e=${run#*|}
        log="$OUT/bench_$(basename "$b")${e:+_${e//[^A-Za-z0-9]/_}}_$round.log"
        env ${e//,/ } PATHATTN_CUDA_PROFILE=1 timeout 150 "$b" --bwd ${CHECK_BENCH_ARGS:---only 64 --iters 5} > "$log" 2>&1
        say "round $round, ${e:+$e }$b --bwd ${CHECK_BENCH_ARGS:---only 64 --iters 5}: rc=$?"
        grep -E '^ +[0-9]' "$log" | tee -a "$OUT/summary.txt"
        python3 "$ROOT/tools/bench_stages.py" "$log" | tee -a "$OUT/summary.txt"
      done
    done
    ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
