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
#                                             third_party_fetched/pre/pre.tar.xz (~20 MB; a call carries at most 64 MiB)
#   tools/gpu_prebuilt.sh run CMD...          on the GPU machine (carry third_party_fetched/pre): unpacks to /tmp/pre
#                                             and runs CMD there with the libraries on LD_LIBRARY_PATH, e.g.
#                                             tools/gpu_prebuilt.sh run ./bench_fwd --bwd --shape 32,4096,32,64
#   tools/gpu_prebuilt.sh turns               on the GPU machine: the bulk turns' first check (docs/perf/notes.md "The
#                                             turns' tiles as bulk reductions"): bench_fwd --bwd at 32 x 4096 (D 64)
#                                             with PATHATTN_BWD_TURNS atomic / bulk alternating, then the D = 64 case
#                                             table with the bulk turns per chunk and with blocks of 2; logs to $OUT
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
    echo "gpu_prebuilt: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1)): ${targets[*]} and $(tar -tJf "$ARCHIVE" | grep -c '^./lib/.') libraries"
    ;;
  run|turns)
    [ -f "$ARCHIVE" ] || { echo "gpu_prebuilt: no $ARCHIVE (pack it here and carry third_party_fetched/pre)"; exit 1; }
    rm -rf /tmp/pre && mkdir -p /tmp/pre && tar -C /tmp/pre -xJf "$ARCHIVE" || exit 1
    export LD_LIBRARY_PATH=/tmp/pre/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    OUT=${OUT:-/tmp/gpu_prebuilt_out}; mkdir -p "$OUT"
    if [ "$CMD" = run ]; then
      cd /tmp/pre && exec "$@"
    fi
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
    cd /tmp/pre
    for t in atomic bulk atomic bulk; do
      echo "== PATHATTN_BWD_TURNS=$t" >> "$OUT/bench.txt"
      PATHATTN_BWD_TURNS=$t PATHATTN_CUDA_PROFILE=1 timeout 60 ./bench_fwd --bwd --iters 3 --shape 32,4096,32,64 \
        >> "$OUT/bench.txt" 2>&1
      echo "rc=$?" >> "$OUT/bench.txt"
    done
    PATHATTN_BWD_TURNS=bulk timeout 120 ./test_cuda_backward \
      --gtest_filter='Cases/CudaBackward.*D64*:CudaBackwardDeterminism.*' > "$OUT/test_bulk.txt" 2>&1
    echo "rc=$?" >> "$OUT/test_bulk.txt"
    PATHATTN_BWD_TURNS=bulk PATHATTN_BWD_BLOCK=2 timeout 120 ./test_cuda_backward \
      --gtest_filter='Cases/CudaBackward.*D64*' > "$OUT/test_bulk_block2.txt" 2>&1
    echo "rc=$?" >> "$OUT/test_bulk_block2.txt"
    cat "$OUT/gpu.txt"
    grep -E '^==|bwd_main|^rc=' "$OUT/bench.txt"
    tail -n 3 "$OUT/test_bulk.txt" "$OUT/test_bulk_block2.txt"
    ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
