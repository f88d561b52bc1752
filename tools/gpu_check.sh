#!/usr/bin/env bash
# The whole GPU check in one call (the device machine is costly to start): build, the gpu tests, compute-sanitizer
# memcheck + racecheck on small cases, then the forward benchmark beside SDPA and fla. Logs go under $OUT,
# packed on exit into one logs-<mode>-<time>.tgz beside summary.txt (tools/out_pack.sh).
#
#   tools/gpu_check.sh [all|test|bench|quick]   (run from the repository root on the H200 machine)
#   all:   build, gpu tests (forward and backward; the T = 16384 backward case too unless GPU_SKIP_LONG=1), sanitizers
#          on small forward and backward cases, bench_fwd --bwd (forward, backward, both summation modes) + baselines
#   quick: the gpu tests and bench_fwd with per-stage times, no sanitizer, no baselines
#   decode: the CUDA decode alone: its gpu tests, memcheck + racecheck on small cases, the tests again with the plain
#          split instances (PATHATTN_DECODE_PREFETCH=0) and with the team kernel for bf16 caches instead of the
#          tensor-core one (PATHATTN_DECODE_MMA=0, its sanitizers too), bench_decode_cuda (plain f32 and bf16
#          caches, bf16 on the team kernel, the bf16 checkpointed cache on both and with the refresh on the CUDA
#          cores (PATHATTN_DECODE_REFRESH_MMA=0, tested and sanitized too), the programmatic combine launch
#          (PATHATTN_DECODE_PDL=1: tests, memcheck, f32 and bf16 benches), the split plan's old counts beside
#          the new (B = 1 bf16 at PATHATTN_DECODE_BLOCKS_PER_SM=2, B = 8 at PATHATTN_DECODE_SPLITS=17), then the
#          f32 checkpointed cache with period DECODE_CKPT_PERIOD, default 64; DECODE_SKIP_CKPT=1 skips it;
#          DECODE_SAN_FILTER: the sanitizers' gtest filter)
#          CHUNK_DECODE=1 (any mode that builds the tests; decode mode always): the chunked decode for calls of several
#          tokens for every S >= 2 (PATHATTN_DECODE_CHUNK=1, kernels/decode_chunk.cuh; the default is S >= 4): its
#          tests, sanitizers, bench_decode_cuda --tokens S with chunks (1) and single steps (0)
#          CHUNK_PATCH=<patch file> (carried): the chunk checks with the patch applied, each bench shape beside the
#          unpatched binary
#   ncu:   the gpu tests, then Nsight Compute on one 32 x 4096 (H 32, D 64) forward: each kernel once
#   bwd:   the gpu tests, bench_fwd --bwd with per-stage times (PATHATTN_CUDA_PROFILE=1), then Nsight Compute on
#          one backward's bwd_main and bwd_local (NCU_SHAPE, default 32,4096,32,64); no baselines; SANITIZE=1 adds the
#          sanitizers, BWD_AB=1 the same bench with the mma.sync main kernel (PATHATTN_BWD_MAIN=mma), NO_NCU=1 skips ncu,
#          SKIP_TESTS=1 / SKIP_BENCH=1 the tests / the bench (a second call on a warm machine)
#   torch: the torch extension and the model built against the machine's torch (CUDA on), pytest tests/python on
#          it (the CUDA decode through the op and the layer: tests/python/test_decode_cuda.py), the model's gpu test
#          (tests/model/test_model_cuda.cpp: its KV-cache decoding through the CUDA decode kernels and its gradients
#          with the fast backward; needs googletest), bench/cuda/bench_short_conv.py (the fused w path beside the
#          torch composition, always), bench/cuda/bench_train.py (forward+backward, peak memory,
#          beside SDPA and fla) and bench_step (a ~100M-parameter PaTH vs RoPE training step, PaTH with the
#          deterministic and the fast backward); SKIP_TRAIN_BENCH=1 stops after the tests; PYTEST_ARGS
#          picks the tests (default tests/python); DECODE_BENCH=1 also runs bench/cuda/bench_decode.py (ours, fla,
#          SDPA decode steps), DECODE_DRIFT=1 bench/cuda/decode_drift.py (f32 vs bf16 cache over 10,000 steps)
#   fwd128: the D = 128 forward (wgmma: the one-E-slot default and the two-E-slot instances, PATHATTN_FWD128=twoe):
#          test_cuda_forward, memcheck on its D = 128 cases, racecheck on a few small ones, with each; bench_fwd
#          --only 128 with the older mma.sync kernel (PATHATTN_FWD128=mma), twoe and the default
#   fwdblock: the two-level forward (PATHATTN_FWD_BLOCK; kernels/fwd_block_carry.cuh): the gpu tests as in test mode
#          (blocks of 1-3 among them), test_cuda_forward with blocks of 4 (the split sweep) and 8 (items)
#          (FWD_VARIANTS), sanitizers on small cases, bench_fwd at both D with stage times without blocks, with 8, 16
#          and by count, each also with the split sweep (FWD_BENCH_VARIANTS); fwd128 and fwdblock share one loop over
#          environment assignments
#   bwdblock: the two-level backward (PATHATTN_BWD_BLOCK; kernels/bwd_block_sweep.cuh and the levels of bwd_main.cuh,
#          docs/math.md Eq. 54-57): the gpu tests as in test mode (SKIP_TESTS=1 skips them; the backward with blocks
#          of 1-3 among them), test_cuda_backward (not Long) with each of BWD_BLOCK_VARIANTS (default: blocks of
#          1 and 3 deterministic, 2 in the fast mode, and the per-chunk mma.sync kernel; even blocks run the two-chunk
#          kernel at D = 64, odd ones and D = 128 the mma.sync one), the Long case (T = 16384) with blocks of 8
#          (BWD_BLOCK_LONG=0 leaves it out), memcheck + racecheck on small cases with each of BWD_BLOCK_SANITIZE
#          (default: blocks of 2), then bench_fwd --bwd at both D with stage times for each of
#          BWD_BLOCK_BENCH (default: the per-chunk mma.sync kernel, the default wgmma kernels, blocks of 4, 8, 16 and
#          by count; BWD_BLOCK_BENCH_ARGS: bench_fwd's arguments, default --only 0 --iters 3). Each variant's case
#          errors are compared with docs/perf/errors_bwd_*.txt (tools/same_errors.py)
#   model: only the model's bench_step
#   turns: the deterministic turns' cost in the wgmma main backward kernels: test_cuda_backward (not Long) and its
#          sanitizers on small cases and the determinism tests (SKIP_TESTS=1 skips them), then bench_fwd --bwd --only 64
#          (and 8 x 4096, H 12) and --only 128 in the wide kernel (TURNS_D128=0: not) without the turns' fences, waits,
#          or both (PATHATTN_BWD_TIMING_SKIP 512 / 1024 / 1536; timing only; TURNS_SKIPS picks the values, default 0
#          512 1024 1536)
#   fence: the deterministic turns' opt-in knobs, the fence as fence.acq_rel.gpu (PATHATTN_BWD_FENCE=acq_rel) and up
#          to 4 passes per fence (PATHATTN_BWD_HELD=4), beside the default (sc, 2): the gpu tests and sanitizers as in
#          test mode (SKIP_TESTS=1 skips every test), test_cuda_backward (not Long) and its sanitizers with both
#          knobs, the MEMBARs each fence compiles to, then bench_fwd --bwd at FENCE_SHAPES (';'-separated bench_fwd
#          arguments) for each variant (FENCE_VARIANTS, FENCE_ROUNDS)
#   pair:  the D = 64 main backward kernel (kernels/bwd_main_pair.cuh): test_cuda_backward (the T = 16384 case too),
#          its case table in the fast mode too (PATHATTN_TEST_BWD_FAST=1), memcheck + racecheck on small cases in both
#          modes, then bench_fwd --bwd --only 64 with stage times for the mma.sync kernel (PATHATTN_BWD_MAIN=mma) and
#          the default
#   local: the chunk-local backward's products in plain TF32 (PATHATTN_BWD_LOCAL=tf32) against the 3xTF32 default:
#          test_cuda_backward with each (every case's error ratios in errors_bwd_{3x,tf32}.log, the worst per
#          gradient in the summary), memcheck on small cases with tf32, bench_fwd --bwd with stage times for each,
#          and ncu (scheduler and warp-state sections) on one bwd_local launch of each (NCU_SHAPE, default 8,4096,32,64)
#   localprof: where the chunk-local backward's time goes (bwd_local.cuh, docs/perf/notes.md v12): bench_fwd --bwd
#          with stage times, then at LOCAL_SHAPE (default 32,4096,32,64) with each of its stages left out
#          (PATHATTN_BWD_TIMING_SKIP 16 / 32 / 64 / 128 / 256, params.h; wrong gradients), and ncu on one bwd_local
#          launch (NCU_SHAPE, default 8,4096,32,64) with its stall samples per instruction (tools/ncu_source_top.py:
#          by opcode and the most-sampled SASS and CUDA lines)
#   ab:    same-run A/B against earlier commits: bench_fwd built from each snapshot of tools/ab_snapshot.sh
#          (third_party_fetched/ab/<rev>, carried along) beside the checkout's, then AB_ROUNDS (default 2) rounds of
#          bench_fwd --bwd --iters 5 AB_ARGS (default --only 64) alternating the builds, with stage medians; the
#          checkout builds bench_fwd only (AB_TESTS=1: its gpu tests too, as in test mode)
#   wide:  the D = 128 wgmma main backward kernel (the default since the nineteenth session; bwd_main_wide.cuh,
#          docs/perf/notes.md v13)
#          beside the mma.sync one: test_cuda_backward's D = 128 cases and the determinism test with it in both modes
#          (PATHATTN_TEST_BWD_FAST=1: the fast mode's instances), memcheck + racecheck on two small D = 128 cases,
#          bench_fwd --bwd --only 128 with each main kernel (stage times)
#   workspace: the scratch limit (Inputs::cuda_workspace_limit, docs/cuda.md "Workspace limit"): its gpu test
#          (one kv head per call gives the same bits), memcheck + racecheck on it, then bench_fwd --bwd with no limit
#          (PATHATTN_CUDA_WORKSPACE_MB=0) and with WORKSPACE_MB (default 1024), and each call's cut (the workspace
#          lines of PATHATTN_CUDA_PROFILE)
#   model: the C++ model's training-step benchmark (bench_step: PaTH on our CUDA op vs RoPE on SDPA, bf16,
#          98M parameters, T 4096, batch 8), built against the machine's torch in build-gpu-torch; then the
#          operators of one step at A5's shapes (bench_step --ops, 1 and 3 layers)
#
# Expects third_party_fetched/googletest (a copy of /usr/src/googletest; the GPU image has no gtest) and
# third_party_fetched/fla (a work tree of fla-org/flash-linear-attention) to be carried along (git-ignored).
set -uo pipefail
MODE=${1:-all}
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
ROOT=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
# On exit every file of $OUT but summary.txt (and ncu reports) goes into one logs-<mode>-<time>.tgz: a call brings
# back only 8 files (tools/out_pack.sh).
. "$ROOT/tools/out_pack.sh"
trap 'pack_out "$MODE"' EXIT

# The torch extension and/or the model against the machine's torch, in build-gpu-torch (model and torch modes
# share it, so either reuses the other's kernels): build_torch LOG TARGET...
# TORCH_TESTS=ON configures the tests too (torch mode, for test_model_cuda: needs googletest, GTEST_PREFIX below).
build_torch() {
  local log=$1; shift
  { cmake -S . -B build-gpu-torch -DPATHATTN_TORCH=ON -DPATHATTN_CUDA=ON -DPATHATTN_TESTS=${TORCH_TESTS:-OFF} -DPATHATTN_BENCH=OFF \
      -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')${GTEST_PREFIX:+;$GTEST_PREFIX}" \
      -DCMAKE_CUDA_COMPILER=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) &&
    make -C build-gpu-torch -j16 "$@"; } > "$OUT/$log" 2>&1
}
# One training step of PaTH vs RoPE (model/bench_step_main.cpp); the table only in the summary (a failed
# mechanism's full error, with torch's backtrace, stays in bench_step.log).
run_bench_step() {
  local t0=$(date +%s)
  timeout 180 build-gpu-torch/model/bench_step --device cuda --csv "$OUT/bench_step.csv" > "$OUT/bench_step.log" 2>&1
  note "bench_step: rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E '^(# |mechanism |[a-z:-]+ +[0-9.]+ )' "$OUT/bench_step.log" | tee -a "$SUMMARY"
  # The operators of one step at A5's shapes (issue 14's launch-bound cells), one and three layers: the difference
  # of a mechanism's two counts / 2 is a layer's (bench_step --ops, model/op_count.h).
  local L
  for L in 1 3; do
    timeout 60 build-gpu-torch/model/bench_step --device cuda --mechanisms path,rope --width 512 --heads 8 \
      --layers $L --vocab 61 --T 11 --batch 256 --warmup 3 --steps 10 --ops 45 > "$OUT/bench_step_ops_l$L.log" 2>&1
    note "bench_step --ops at A5's shape, $L layer(s): rc=$?"
    grep -E '^(mechanism |[a-z:-]+ +[0-9.]+ |[a-z:-]+ +[0-9]+ launching)' "$OUT/bench_step_ops_l$L.log" | cut -c1-400 |
      tee -a "$SUMMARY"
  done
}

# compute-sanitizer memcheck and racecheck of one test binary on the cases of a gtest filter, a summary line each:
# sanitize TAG BINARY FILTER [TIMEOUT]; logs in $OUT/sanitizer_TAG_{memcheck,racecheck}.log.
sanitize() {
  local tag=$1 bin=$2 filter=$3 limit=${4:-300} tool t0
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 3 "$bin" --gtest_filter="$filter" \
      > "$OUT/sanitizer_${tag}_$tool.log" 2>&1
    note "compute-sanitizer $tool ($tag): rc=$?, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_${tag}_$tool.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
  done
}

# compute-sanitizer memcheck + racecheck on small forward and backward cases (a few minutes).
run_sanitizers() {
  local SMALL='*B1_T65_H1_HQ4_D64_DV64_betauniform_gate_bf16:*T331_H2_HQ4_D64*varlen7_bf16:*B2_T65_H2_HQ2_D128_DV128_betauniform_f16:CudaSupport.*'
  local SMALL_BWD='*B1_T65_H1_HQ4_D64_DV64_betauniform_gate_bf16:*T331_H2_HQ4_D64*varlen7_bf16:*B2_T65_H2_HQ2_D128_DV128_betauniform_f16'
  local tool t0 rc
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    compute-sanitizer --tool $tool --error-exitcode 3 build-gpu/tests/cuda/test_cuda_forward --gtest_filter="$SMALL" \
      > "$OUT/sanitizer_one.log" 2>&1
    rc=$?
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 3 build-gpu/tests/cuda/test_cuda_backward --gtest_filter="$SMALL_BWD" \
      >> "$OUT/sanitizer_one.log" 2>&1
    rc=$((rc + $?))
    note "compute-sanitizer $tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_one.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
    { echo "==== $tool"; cat "$OUT/sanitizer_one.log"; } >> "$OUT/sanitizer.log"; rm -f "$OUT/sanitizer_one.log"
  done
}

# test_cuda_backward under the caller's environment (e.g. PATHATTN_BWD_LOCAL=tf32 tests_bwd tf32): the log in
# $OUT/errors_bwd_TAG.log (every case's error ratios), a summary line and the failed cases: tests_bwd TAG [gtest args].
tests_bwd() {
  local tag=$1 t0; shift
  t0=$(date +%s)
  timeout ${BWD_TEST_TIMEOUT:-420} build-gpu/tests/cuda/test_cuda_backward "$@" > "$OUT/errors_bwd_$tag.log" 2>&1
  note "test_cuda_backward ($tag): rc=$?, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/errors_bwd_$tag.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
  grep -E '^\[  FAILED  \]' "$OUT/errors_bwd_$tag.log" | head -20 | tee -a "$SUMMARY"
  # Each case's errors against a recorded commit's (deterministic cases with the same sums print the same digits).
  for ref in docs/perf/errors_bwd_*.txt; do
    [ -f "$ref" ] && python3 tools/same_errors.py "$OUT/errors_bwd_$tag.log" "$ref" | sed "s/^/($tag) /" | tee -a "$SUMMARY"
  done
}
# Small D = 64 backward cases for the sanitizers (gate + GQA, varlen with length-1 sequences, B > 1 f16).
SMALL_BWD64='*B1_T65_H1_HQ4_D64_DV64_betauniform_gate_bf16:*T331_H2_HQ4_D64*varlen7_bf16:*B2_T200_H2_HQ2_D64*'

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; nvcc --version | tail -2;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } >> "$SUMMARY" 2>&1

# googletest from the carried source when the image has none.
PREFIX_ARGS=()
GTEST_PREFIX=""
HAVE_GTEST=ON
if ! ls /usr/lib/x86_64-linux-gnu/cmake/GTest /usr/local/lib/cmake/GTest >/dev/null 2>&1; then
  HAVE_GTEST=OFF
  if [ -d third_party_fetched/googletest ]; then
    if (cmake -S third_party_fetched/googletest -B /tmp/gtest-build -DCMAKE_INSTALL_PREFIX=/tmp/gtest -DBUILD_GMOCK=OFF \
       >/dev/null && make -C /tmp/gtest-build -j16 install >/dev/null); then HAVE_GTEST=ON; else note "googletest build FAILED"; fi
    PREFIX_ARGS=(-DCMAKE_PREFIX_PATH=/tmp/gtest)
    GTEST_PREFIX=/tmp/gtest
  fi
fi

# model mode first, and alone: it needs no googletest (tests off) and none of the builds below.
if [ "$MODE" = model ]; then
  t0=$(date +%s)
  if build_torch model_build.log bench_step; then
    note "model build: ok ($(( $(date +%s) - t0 )) s)"
    run_bench_step
  else
    note "model build FAILED (see model_build.log)"; tail -20 "$OUT/model_build.log"
  fi
  echo "==== summary"; cat "$SUMMARY"; exit 0
fi

BUILD_TARGETS="test_cuda_forward test_cuda_backward test_cuda_decode test_cuda_short_conv bench_fwd bench_decode_cuda bench_short_conv_cuda"
[ "$MODE" = ab ] && [ "${AB_TESTS:-0}" != 1 ] && BUILD_TARGETS=bench_fwd
[ "$MODE" = turns ] && BUILD_TARGETS="bench_fwd test_cuda_backward"
t0=$(date +%s)
if [ "$MODE" != torch ] && ! { cmake -S . -B build-gpu -DPATHATTN_TORCH=OFF -DPATHATTN_CUDA=ON -DPATHATTN_TESTS=ON -DPATHATTN_BENCH=ON -DCMAKE_CUDA_COMPILER=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) \
         "${PREFIX_ARGS[@]}" && make -C build-gpu -j16 $BUILD_TARGETS; } > "$OUT/build.log" 2>&1; then
  note "BUILD FAILED (see build.log)"; tail -30 "$OUT/build.log"; exit 1
fi
[ "$MODE" != torch ] && note "build: ok ($(( $(date +%s) - t0 )) s)"
# Opcode histogram of the D = 64 main kernel (bf16, no gate): what a warp issues (docs/perf/notes.md).
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass -fun '_ZN8pathattn4cuda16fwd_wgmma_kernelI13__nv_bfloat16Lb0EEEvNS0_9FwdParamsE14CUtensorMap_stS4_S4_' \
    build-gpu/bench/cuda/bench_fwd 2>/dev/null | grep -oE '^ +/\*[0-9a-f]{4}\*/ +[A-Z0-9_.]+' | awk '{print $2}' |
    sort | uniq -c | sort -rn > "$OUT/sass_fwd_wgmma.txt" || true
fi
# Serialised wgmma in this machine's build (its nvcc may differ from the CI's): tools/check_ptxas.py on the reports
# tools/nvcc_logged.sh kept (docs/cuda.md "ptxas's reports, checked").
[ "$MODE" != torch ] && [ -d build-gpu/ptxas ] && note "ptxas reports: $(python3 tools/check_ptxas.py build-gpu/ptxas | tail -1)"
grep -A2 "Compiling entry function.*\(fwd_kernel\|bwd_main\|bwd_local\)" "$OUT/build.log" | grep -E "entry|registers|spill" | tail -48 >> "$OUT/registers.txt" || true
# Where bwd_local's spills sit at D = 64 (bf16, TF32 products, without and with the gate): tools/sass_spills.py on its
# SASS (docs/perf/notes.md v14, v15): straight-line spills around the solve are cheap, spills inside loops are not.
spill_map() {
  local bin=$1/bench/cuda/bench_fwd g fun
  command -v cuobjdump >/dev/null && [ -x "$bin" ] || return 0
  for g in 0 1; do
    fun="_ZN8pathattn4cuda16bwd_local_kernelI13__nv_bfloat16Li64ELb${g}ELb1EEEvNS0_9BwdParamsE"
    note "spills of bwd_local<bf16, 64, gate $g, tf32> in $1: $(cuobjdump -sass -fun "$fun" "$bin" 2>/dev/null |
      python3 tools/sass_spills.py --max 0)"
    [ $g = 0 ] && cuobjdump -sass -fun "$fun" "$bin" 2>/dev/null | python3 tools/sass_spills.py --max 200 \
      > "$OUT/spills_$(basename "$1").txt"
  done
}
spill_map build-gpu

if [ "$MODE" = all ] || [ "$MODE" = test ] || [ "$MODE" = quick ] || [ "$MODE" = ncu ] || [ "$MODE" = bwd ] ||
   [ "$MODE" = fence ] || [ "$MODE" = fwdblock ] || [ "$MODE" = bwdblock ] || { [ "$MODE" = ab ] && [ "${AB_TESTS:-0}" = 1 ]; }; then
  t0=$(date +%s)
  if [ "${SKIP_TESTS:-0}" != 1 ]; then
  EXCL=(); [ "${GPU_SKIP_LONG:-0}" = 1 ] && EXCL=(-E 'Long/')
  (cd build-gpu && ctest -L gpu -j 16 --output-on-failure --timeout 400 "${EXCL[@]}") > "$OUT/tests.log" 2>&1
  note "gpu tests: $(grep -E 'tests passed|tests failed' "$OUT/tests.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)" "$OUT/tests.log" | head -20 | tee -a "$SUMMARY"
  # The fused short convolution of w (kernels/short_conv.cuh): small cases, so both sanitizers run with the tests.
  # The vector form (kernels/short_conv_vec.cuh) is the default; then the row kernels for every call
  # (PATHATTN_SHORT_CONV=rows; the cases the vector form does not take run them either way): the test and both
  # sanitizers.
  if [ -x build-gpu/tests/cuda/test_cuda_short_conv ]; then
    sanitize short_conv build-gpu/tests/cuda/test_cuda_short_conv 'CudaShortConv.*' 300
    PATHATTN_SHORT_CONV=rows build-gpu/tests/cuda/test_cuda_short_conv > "$OUT/tests_short_conv_rows.log" 2>&1
    note "test_cuda_short_conv, PATHATTN_SHORT_CONV=rows: rc=$?, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_short_conv_rows.log" | tr '\n' ' ')"
    grep -E "Failure|want|Google Test trace|^/.*:[0-9]+: " "$OUT/tests_short_conv_rows.log" | head -12 | tee -a "$SUMMARY"
    PATHATTN_SHORT_CONV=rows sanitize short_conv_rows build-gpu/tests/cuda/test_cuda_short_conv 'CudaShortConv.*' 300
  fi
  # ... and its two forms timed without torch (a few seconds each).
  if [ -x build-gpu/bench/cuda/bench_short_conv_cuda ]; then
    for sc in rows vec; do
      PATHATTN_SHORT_CONV=$sc timeout 120 build-gpu/bench/cuda/bench_short_conv_cuda > "$OUT/bench_short_conv_$sc.log" 2>&1
      note "bench_short_conv_cuda, PATHATTN_SHORT_CONV=$sc: rc=$?"
      grep -E '^#|^\|' "$OUT/bench_short_conv_$sc.log" | tee -a "$SUMMARY"
    done
  fi
  # Per-case errors (o / lse / kcache against the f64 reference and the low-precision baseline), one run.
  if [ "${SKIP_ERRLOG:-0}" != 1 ]; then
    build-gpu/tests/cuda/test_cuda_forward > "$OUT/errors.log" 2>&1 || true
    build-gpu/tests/cuda/test_cuda_backward --gtest_filter=-Long/* > "$OUT/errors_bwd.log" 2>&1 || true
    grep -E "^\[  FAILED|^\[  PASSED" "$OUT/errors_bwd.log" | tail -20 | tee -a "$SUMMARY"
    # The same bits as an earlier commit? Every case's errors against that commit's (docs/perf/errors_bwd_<rev>.txt):
    # deterministic cases must print the same four digits; the fast-mode ones may differ (their atomic order varies).
    for ref in docs/perf/errors_bwd_*.txt; do
      [ -f "$ref" ] || continue
      python3 tools/same_errors.py "$OUT/errors_bwd.log" "$ref" | tee -a "$SUMMARY"
    done
  fi
  fi

  if [ "$MODE" != quick ] && [ "$MODE" != ncu ] && { [ "$MODE" != bwd ] || [ "${SANITIZE:-0}" = 1 ]; }; then
    run_sanitizers
  fi
fi
# The chunked decode (kernels/decode_chunk.cuh) for every call of several tokens (PATHATTN_DECODE_CHUNK=1; the
# default takes it from 4 tokens): the decode tests with it (the S = 2 calls too), memcheck +
# racecheck on the chunked cases and the graph replays, then bench_decode_cuda --tokens S with and without it on a
# few shapes (CHUNK_SHAPES, CHUNK_TOKENS). CHUNK_DECODE=1 runs it in any mode that builds the tests; decode mode always.
# CHUNK_PATCH=<file>: a patch of the chunked decode to try (e.g. third_party_fetched/ab/vectortile.patch, carried):
# the checkout's bench_decode_cuda is kept aside, the patch applied to the tree in place and build-gpu rebuilt (only
# what the patch touches recompiles); the tests and sanitizers then run on the patched build, and each bench shape
# runs the patched binary and the kept one back to back. The tree stays patched (a later call: a fresh machine).
patched_build() {
  cp build-gpu/bench/cuda/bench_decode_cuda /tmp/bench_decode_cuda.base &&
    patch -p1 < "$CHUNK_PATCH" > "$OUT/build_patched.log" 2>&1 &&
    make -C build-gpu -j16 test_cuda_decode bench_decode_cuda >> "$OUT/build_patched.log" 2>&1
}
chunk_decode_checks() {
  local t0 rc shape S on env B=build-gpu base=
  if [ -n "${CHUNK_PATCH:-}" ]; then
    t0=$(date +%s)
    if patched_build; then base=/tmp/bench_decode_cuda.base; note "patched build ($CHUNK_PATCH): ok ($(( $(date +%s) - t0 )) s)"
    else note "patched build ($CHUNK_PATCH) FAILED"; tail -20 "$OUT/build_patched.log" | tee -a "$SUMMARY"; return; fi
  fi
  for env in PATHATTN_DECODE_CHUNK= PATHATTN_DECODE_CHUNK=1; do  # the default (chunks from 4 tokens), then every call
    t0=$(date +%s)
    env "$env" "$B"/tests/cuda/test_cuda_decode > "$OUT/tests_decode_chunk.log" 2>&1
    note "decode gpu tests, $env: rc=$?, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_decode_chunk.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
    grep -E "^\[  FAILED  \]|ratio to bound [1-9]|Failure|Expected|Which is|rel err" "$OUT/tests_decode_chunk.log" |
      grep -v "ratio to bound 0" | head -30 | tee -a "$SUMMARY"
  done
  grep -A12 "ACallOfSTokens" "$OUT/tests_decode_chunk.log" | grep -E "rel err|OK|FAILED" | tee -a "$SUMMARY"
  PATHATTN_DECODE_CHUNK=1 sanitize decode_chunk "$B"/tests/cuda/test_cuda_decode \
    "${CHUNK_SAN_FILTER:-*chunked*:CudaDecode.*:*CudaDecodeGraph*}" 300
  for shape in ${CHUNK_SHAPES:-1,16384,64 8,16384,64 64,4096,64 1,65536,128 8,16384,128}; do
    for S in ${CHUNK_TOKENS:-4 16 64}; do
      for on in 0 1; do
        PATHATTN_DECODE_CHUNK=$on timeout 120 build-gpu/bench/cuda/bench_decode_cuda --shape "$shape" --tokens "$S" \
          --iters 10 > "$OUT/bench_decode_chunk.log" 2>&1
        rc=$?
        note "bench_decode_cuda --tokens $S, PATHATTN_DECODE_CHUNK=$on (rc=$rc):$(grep -E '^ +[0-9]' "$OUT/bench_decode_chunk.log" | tail -1)"
      done
      if [ -n "$base" ]; then
        PATHATTN_DECODE_CHUNK=1 timeout 120 "$base" --shape "$shape" --tokens "$S" \
          --iters 10 > "$OUT/bench_decode_chunk.log" 2>&1
        rc=$?
        note "bench_decode_cuda --tokens $S, PATHATTN_DECODE_CHUNK=1, unpatched (rc=$rc):$(grep -E '^ +[0-9]' "$OUT/bench_decode_chunk.log" | tail -1)"
      fi
    done
  done
}
if [ "${CHUNK_DECODE:-0}" = 1 ] || [ "$MODE" = decode ]; then
  [ "$MODE" = ab ] && [ "${AB_TESTS:-0}" != 1 ] || chunk_decode_checks
fi
if [ "$MODE" = decode ]; then
  t0=$(date +%s)
  (cd build-gpu && ctest -L gpu -R CudaDecode -j 8 --output-on-failure --timeout 400) > "$OUT/tests_decode.log" 2>&1
  note "decode gpu tests: $(grep -E 'tests passed|tests failed' "$OUT/tests_decode.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)" "$OUT/tests_decode.log" | head -20 | tee -a "$SUMMARY"
  build-gpu/tests/cuda/test_cuda_decode > "$OUT/errors_decode.log" 2>&1 || true
  sanitize decode build-gpu/tests/cuda/test_cuda_decode \
    "${DECODE_SAN_FILTER:-*D64_bf16_gate_p0x1x77*:*HQ16_D128*:*kbf16_vlow:*chunked*:CudaDecode.*:*CudaDecodeGraph*:CudaDecodeErrors.*}" 400
  # The split kernel's plain instances (PATHATTN_DECODE_PREFETCH=0; the prefetching ones are the default since the
  # eleventh session): the same tests.
  t0=$(date +%s)
  PATHATTN_DECODE_PREFETCH=0 build-gpu/tests/cuda/test_cuda_decode > "$OUT/tests_decode_noprefetch.log" 2>&1
  note "decode gpu tests, PATHATTN_DECODE_PREFETCH=0: rc=$?, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_decode_noprefetch.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
  # The team split kernel for bf16 keys and values (PATHATTN_DECODE_MMA=0; the tensor-core kernel,
  # kernels/decode_mma.cuh, is their default since the twelfth session): the same tests, the sanitizers on the
  # 16-bit cache's cases.
  t0=$(date +%s)
  PATHATTN_DECODE_MMA=0 build-gpu/tests/cuda/test_cuda_decode > "$OUT/tests_decode_team.log" 2>&1
  note "decode gpu tests, PATHATTN_DECODE_MMA=0: rc=$?, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_decode_team.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
  grep -E "^\[  FAILED  \]|ratio to bound [1-9]" "$OUT/tests_decode_team.log" | head -20 | tee -a "$SUMMARY"
  PATHATTN_DECODE_MMA=0 sanitize decode_team build-gpu/tests/cuda/test_cuda_decode '*bf16*kbf16_vlow:*bf16*kbf16_vlow_ckpt*:CudaDecode.*:*CudaDecodeGraph*' 300
  # The checkpointed cache's refresh on the CUDA cores for bf16 keys (PATHATTN_DECODE_REFRESH_MMA=0; the tensor-core
  # refresh, kernels/decode_refresh_mma.cuh, is the default): the same tests (its three bf16-key checkpointed cases
  # refresh 2-4 times each), the sanitizers on the checkpointed cases.
  t0=$(date +%s)
  PATHATTN_DECODE_REFRESH_MMA=0 build-gpu/tests/cuda/test_cuda_decode > "$OUT/tests_decode_refresh_cores.log" 2>&1
  note "decode gpu tests, PATHATTN_DECODE_REFRESH_MMA=0: rc=$?, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_decode_refresh_cores.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
  grep -E "^\[  FAILED  \]|ratio to bound [1-9]" "$OUT/tests_decode_refresh_cores.log" | head -20 | tee -a "$SUMMARY"
  PATHATTN_DECODE_REFRESH_MMA=0 sanitize decode_refresh_cores build-gpu/tests/cuda/test_cuda_decode '*ckpt*' 300
  # The combine kernel as a programmatic dependent of the split kernel (PATHATTN_DECODE_PDL=1, opt-in): the tests
  # (the CUDA-graph capture among them), memcheck on them; its benches follow the default ones below.
  t0=$(date +%s)
  PATHATTN_DECODE_PDL=1 build-gpu/tests/cuda/test_cuda_decode > "$OUT/tests_decode_pdl.log" 2>&1
  note "decode gpu tests, PATHATTN_DECODE_PDL=1: rc=$?, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_decode_pdl.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
  grep -E "^\[  FAILED  \]|ratio to bound [1-9]" "$OUT/tests_decode_pdl.log" | head -20 | tee -a "$SUMMARY"
  t0=$(date +%s)
  PATHATTN_DECODE_PDL=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 build-gpu/tests/cuda/test_cuda_decode \
    --gtest_filter="${DECODE_SAN_FILTER:-*D64_bf16_gate_p0x1x77*:*HQ16_D128*:*kbf16_vlow:*chunked*:CudaDecode.*:*CudaDecodeGraph*:CudaDecodeErrors.*}" \
    > "$OUT/sanitizer_decode_pdl_memcheck.log" 2>&1
  note "compute-sanitizer memcheck (decode, PATHATTN_DECODE_PDL=1): rc=$?, $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_decode_pdl_memcheck.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
  t0=$(date +%s)
  timeout 300 build-gpu/bench/cuda/bench_decode_cuda > "$OUT/bench_decode.log" 2>&1
  note "bench_decode_cuda: rc=$? ($(( $(date +%s) - t0 )) s)"
  tee -a "$SUMMARY" < "$OUT/bench_decode.log"
  # The same with the programmatic combine launch (PATHATTN_DECODE_PDL=1), f32 and bf16 caches.
  for cache in f32 bf16; do
    t0=$(date +%s)
    PATHATTN_DECODE_PDL=1 timeout 300 build-gpu/bench/cuda/bench_decode_cuda --cache $cache > "$OUT/bench_decode_pdl_$cache.log" 2>&1
    note "bench_decode_cuda --cache $cache, PATHATTN_DECODE_PDL=1: rc=$? ($(( $(date +%s) - t0 )) s)"
    tee -a "$SUMMARY" < "$OUT/bench_decode_pdl_$cache.log"
  done
  # The bf16 cache (bf16 keys and values): the team kernel, then the tensor-core kernel (the default).
  for mma in 0 1; do
    t0=$(date +%s)
    PATHATTN_DECODE_MMA=$mma timeout 300 build-gpu/bench/cuda/bench_decode_cuda --cache bf16 > "$OUT/bench_decode_bf16_mma$mma.log" 2>&1
    note "bench_decode_cuda --cache bf16, PATHATTN_DECODE_MMA=$mma: rc=$? ($(( $(date +%s) - t0 )) s)"
    tee -a "$SUMMARY" < "$OUT/bench_decode_bf16_mma$mma.log"
  done
  # The checkpointed bf16 cache (period 64): the team kernel, the tensor-core kernel's kCkpt instances, then those
  # with the refresh on tensor cores (PATHATTN_DECODE_REFRESH_MMA=1, the default).
  for sel in "0 0" "1 0" "1 1"; do
    read -r mma rmma <<< "$sel"
    t0=$(date +%s)
    PATHATTN_DECODE_MMA=$mma PATHATTN_DECODE_REFRESH_MMA=$rmma timeout 200 build-gpu/bench/cuda/bench_decode_cuda \
      --cache bf16 --ckpt 64 > "$OUT/bench_decode_bf16_ckpt_mma${mma}_refresh$rmma.log" 2>&1
    note "bench_decode_cuda --cache bf16 --ckpt 64, PATHATTN_DECODE_MMA=$mma PATHATTN_DECODE_REFRESH_MMA=$rmma: rc=$? ($(( $(date +%s) - t0 )) s)"
    tee -a "$SUMMARY" < "$OUT/bench_decode_bf16_ckpt_mma${mma}_refresh$rmma.log"
  done
  # Small batches: the bf16 cache's one wave counted at two blocks per SM (PATHATTN_DECODE_BLOCKS_PER_SM=2, the
  # twelfth session's plan), against the default that counts the D = 128 tensor-core kernel's one block per SM
  # (thirteenth session); only the B = 1 rows are of interest here.
  t0=$(date +%s)
  PATHATTN_DECODE_BLOCKS_PER_SM=2 timeout 120 build-gpu/bench/cuda/bench_decode_cuda --cache bf16 \
    > "$OUT/bench_decode_bf16_blocks2.log" 2>&1
  note "bench_decode_cuda --cache bf16, PATHATTN_DECODE_BLOCKS_PER_SM=2: rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^#|^ +(64|128) +1 " "$OUT/bench_decode_bf16_blocks2.log" | tee -a "$SUMMARY"
  # B = 8: the split count that fills the last wave best (16, thirteenth session) against the old rounded-up 17
  # (PATHATTN_DECODE_SPLITS=17 forces it for every row; only the B = 8 rows are of interest), f32 and bf16 caches.
  for cache in f32 bf16; do
    t0=$(date +%s)
    PATHATTN_DECODE_SPLITS=17 timeout 120 build-gpu/bench/cuda/bench_decode_cuda --cache $cache \
      > "$OUT/bench_decode_${cache}_splits17.log" 2>&1
    note "bench_decode_cuda --cache $cache, PATHATTN_DECODE_SPLITS=17: rc=$? ($(( $(date +%s) - t0 )) s)"
    grep -E "^#|^ +(64|128) +8 " "$OUT/bench_decode_${cache}_splits17.log" | tee -a "$SUMMARY"
  done
  # The checkpointed cache (docs/cuda.md "Decode"); DECODE_SKIP_CKPT=1 leaves it out.
  [ "${DECODE_SKIP_CKPT:-0}" = 1 ] || {
  t0=$(date +%s)
  timeout 300 build-gpu/bench/cuda/bench_decode_cuda --ckpt ${DECODE_CKPT_PERIOD:-64} > "$OUT/bench_decode_ckpt.log" 2>&1
  note "bench_decode_cuda --ckpt: rc=$? ($(( $(date +%s) - t0 )) s)"
  tee -a "$SUMMARY" < "$OUT/bench_decode_ckpt.log"
  }
fi
if [ "$MODE" = fwd128 ] || [ "$MODE" = fwdblock ]; then
  # Forward variants, each one or more environment assignments (comma-separated): the forward tests (all of them)
  # with each of FWD_VARIANTS,
  # memcheck and racecheck on a few cases with each, then bench_fwd (stage times) with each of FWD_BENCH_VARIANTS in
  # one run.
  # fwd128: the D = 128 forward on wgmma, the default kernel (one E slot, two CTAs per SM) and the two-E-slot
  #   instances (PATHATTN_FWD128=twoe: one CTA per SM); memcheck on the D = 128 cases, racecheck on a few small ones
  #   (all D = 128 cases take racecheck over 300 s); bench_fwd --only 128 with the mma.sync kernel, twoe and the
  #   default (onee is the default kernel's name, the variable takes no other: src/common/env.h).
  # fwdblock: the two-level forward (PATHATTN_FWD_BLOCK, docs/math.md Eq. 51-53): first all gpu tests as in test
  #   mode (among them test_cuda_forward with blocks of 1-3, ctest entries), then the forward tests with blocks of 4
  #   (the split sweep) and 8 (the item form), the sanitizers on small cases of both D that have several blocks, then
  #   bench_fwd at both D (stage times: the "blocks" stage is the block preprocess) without blocks, with 8, 16 and by
  #   count (-1), each with the sweep (the default) and the split sweep. (2, 4 and the item form: thirtieth session.)
  if [ "$MODE" = fwd128 ]; then
    test_variants=${FWD_VARIANTS:-PATHATTN_FWD128=onee PATHATTN_FWD128=twoe}
    bench_variants=${FWD_BENCH_VARIANTS:-PATHATTN_FWD128=mma PATHATTN_FWD128=twoe PATHATTN_FWD128=onee}
    mem_filter='*D128*' race_filter='*T65_H2_HQ2_D128*:*T65_H1_HQ4_D128*gate*:*T331_H2_HQ4_D128*varlen7*'
    bench_args=(--only 128)
  else
    test_variants=${FWD_VARIANTS:-PATHATTN_FWD_BLOCK=4,PATHATTN_FWD_BLOCK_CARRY=split PATHATTN_FWD_BLOCK=8,PATHATTN_FWD_BLOCK_CARRY=items}
    bench_variants=${FWD_BENCH_VARIANTS:-PATHATTN_FWD_BLOCK=0 PATHATTN_FWD_BLOCK=8 PATHATTN_FWD_BLOCK=16 PATHATTN_FWD_BLOCK=-1 PATHATTN_FWD_BLOCK=8,PATHATTN_FWD_BLOCK_CARRY=split PATHATTN_FWD_BLOCK=16,PATHATTN_FWD_BLOCK_CARRY=split PATHATTN_FWD_BLOCK=-1,PATHATTN_FWD_BLOCK_CARRY=split}
    mem_filter='*T1000*:*T331_H2_HQ4*varlen7*:*T200_H1_HQ4*gate*'
    race_filter='*T331_H2_HQ4_D64*varlen7*:*T200_H1_HQ4_D128*gate*:*B1_T1000_H2_HQ2_D64*bf16'
    bench_args=(--only 0 --iters 10)
  fi
  for v in $test_variants; do
    t0=$(date +%s)
    env ${v//,/ } timeout 400 build-gpu/tests/cuda/test_cuda_forward > "$OUT/tests_fwd_$v.log" 2>&1
    note "test_cuda_forward, $v: rc=$?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests_fwd_$v.log" | tr '\n' ' ')($(( $(date +%s) - t0 )) s)"
    grep -E '^\[  FAILED  \]' "$OUT/tests_fwd_$v.log" | head -20 | tee -a "$SUMMARY"
    for tool in memcheck racecheck; do
      filter=$mem_filter; [ $tool = racecheck ] && filter=$race_filter
      t0=$(date +%s)
      env ${v//,/ } timeout 300 compute-sanitizer --tool $tool --error-exitcode 3 build-gpu/tests/cuda/test_cuda_forward \
        --gtest_filter="$filter" > "$OUT/sanitizer_fwd_${v}_$tool.log" 2>&1
      note "compute-sanitizer $tool ($v): rc=$?, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_fwd_${v}_$tool.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
    done
  done
  for v in $bench_variants; do
    env ${v//,/ } PATHATTN_CUDA_PROFILE=1 timeout 200 build-gpu/bench/cuda/bench_fwd "${bench_args[@]}" > "$OUT/bench_fwd_$v.log" 2>&1
    note "bench_fwd ${bench_args[*]}, $v: rc=$?"
    grep -E '^#|^ +B|^ +[0-9]' "$OUT/bench_fwd_$v.log" | tee -a "$SUMMARY"
    python3 tools/bench_stages.py "$OUT/bench_fwd_$v.log" | tee -a "$SUMMARY"
  done
fi
if [ "$MODE" = workspace ]; then
  t0=$(date +%s)
  timeout 200 build-gpu/tests/cuda/test_cuda_backward --gtest_filter='CudaWorkspaceLimit.*' > "$OUT/tests_workspace.log" 2>&1
  note "test_cuda_backward CudaWorkspaceLimit: rc=$?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests_workspace.log" | tr '\n' ' ')($(( $(date +%s) - t0 )) s)"
  sanitize workspace build-gpu/tests/cuda/test_cuda_backward 'CudaWorkspaceLimit.*'
  for mb in 0 ${WORKSPACE_MB:-1024}; do
    env_mb=(PATHATTN_CUDA_WORKSPACE_MB=$mb)
    env "${env_mb[@]}" timeout 250 build-gpu/bench/cuda/bench_fwd --bwd --iters 5 > "$OUT/bench_ws_$mb.log" 2>&1
    note "bench_fwd --bwd, workspace limit $mb: rc=$?"
    grep -E '^#|^ +B|^ +[0-9]' "$OUT/bench_ws_$mb.log" | tee -a "$SUMMARY"
    env "${env_mb[@]}" PATHATTN_CUDA_PROFILE=1 timeout 120 build-gpu/bench/cuda/bench_fwd --bwd --iters 1 2>&1 |
      grep -E 'workspace|^ +[0-9]' | awk '/workspace/{if (!seen[$0]++) print; next} {print; delete seen}' | tee -a "$SUMMARY"
  done
fi
if [ "$MODE" = quick ]; then
  # Per shape: the last run's stage times, then bench_fwd's row.
  PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --iters 5 --csv "$OUT/ours.csv" > "$OUT/bench.log" 2>&1
  awk '/profile\] prep/{p=$4} /profile\] main/{m=$4} /^ +[0-9]/{print $0, "  prep", p, "main", m; next} /^#|^ +B/' "$OUT/bench.log" | tee -a "$SUMMARY"
fi

if [ "$MODE" = ncu ]; then
  # One warm-up call is profiled too (--iters 1 still warms up 3 times): skip it, keep the next call's kernels.
  t0=$(date +%s)
  ncu --clock-control none -k "regex:${NCU_KERNELS:-prep_tc|fwd_kernel}" --launch-skip ${NCU_SKIP:-2} --launch-count ${NCU_COUNT:-2} \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section ComputeWorkloadAnalysis --section SchedulerStats \
    build-gpu/bench/cuda/bench_fwd --iters 1 --shape ${NCU_SHAPE:-32,4096,32,64} > "$OUT/ncu.txt" 2>&1
  note "ncu: rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Warp Cycles Per Issued|Issued Ipc|No Eligible|Stall|Shared Memory Configuration|Dynamic Shared" "$OUT/ncu.txt" | head -120 | tee -a "$SUMMARY"
fi

# turns: what the deterministic mode's ordered turns cost in the wgmma main kernels (bwd_main_pair.cuh at D = 64,
# bwd_main_wide.cuh at D = 128): bench_fwd --bwd --only 64 / 128 with stage times with the turns whole, without their
# fences (PATHATTN_BWD_TIMING_SKIP=512), without their waits (1024), and without either (1536), at the default shapes
# and the training step's (8 x 4096, H 12). Timing only: without them the sums' order is not fixed.
if [ "$MODE" = turns ]; then
  if [ "${SKIP_TESTS:-0}" != 1 ]; then  # the two-chunk kernel's tests and sanitizers first
    tests_bwd turns --gtest_filter=-Long/*
    sanitize turns build-gpu/tests/cuda/test_cuda_backward "$SMALL_BWD64:CudaBackwardDeterminism.*" 300
  fi
  for skip in ${TURNS_SKIPS:-0 512 1024 1536}; do
    PATHATTN_BWD_TIMING_SKIP=$skip PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --iters 5 --only 64 \
      > "$OUT/bench_turns_$skip.log" 2>&1
    note "bench_fwd --bwd --only 64, PATHATTN_BWD_TIMING_SKIP=$skip: rc=$?"
    python3 tools/bench_stages.py "$OUT/bench_turns_$skip.log" | tee -a "$SUMMARY"
    PATHATTN_BWD_TIMING_SKIP=$skip PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --iters 5 \
      --shape 8,4096,12,64 > "$OUT/bench_turns_step_$skip.log" 2>&1
    python3 tools/bench_stages.py "$OUT/bench_turns_step_$skip.log" | tee -a "$SUMMARY"
    # D = 128 in the column-split wgmma kernel (the fast mode's default; the deterministic one runs the mma.sync
    # kernel with blocks, whose turns are per CTA): TURNS_D128=0 leaves it out.
    if [ "${TURNS_D128:-1}" = 1 ]; then
      PATHATTN_BWD_MAIN=wgmma PATHATTN_BWD_TIMING_SKIP=$skip PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd \
        --bwd --iters 5 --only 128 > "$OUT/bench_turns_128_$skip.log" 2>&1
      note "bench_fwd --bwd --only 128 (wide kernel), PATHATTN_BWD_TIMING_SKIP=$skip: rc=$?"
      python3 tools/bench_stages.py "$OUT/bench_turns_128_$skip.log" | tee -a "$SUMMARY"
    fi
  done
fi
if [ "$MODE" = fence ]; then
  # The deterministic turns' two opt-in knobs against the measured default (sc, 2): the fence before a pass as
  # fence.acq_rel.gpu (PATHATTN_BWD_FENCE=acq_rel, bwd_tiles.cuh TurnFence) and up to 4 passes held per fence
  # (PATHATTN_BWD_HELD=4, bwd_main_pair.cuh defer_pass). After the gpu tests with the defaults (the block above:
  # the default path's passes changed form with HeldPasses), the backward tests with both knobs at once (the
  # determinism tests' bit-identical repeats among them, D = 64 and 128), racecheck and memcheck on the small D = 64
  # cases and the determinism tests, which MEMBAR each fence compiles to, then bench_fwd --bwd at FENCE_SHAPES
  # (default: --only 64, --only 128, the training step's shape) for each of FENCE_VARIANTS (fence:held, default
  # "sc:2 acq_rel:2 sc:4 acq_rel:4"), FENCE_ROUNDS rounds (default 1).
  if [ "${SKIP_TESTS:-0}" != 1 ]; then
    PATHATTN_BWD_FENCE=acq_rel PATHATTN_BWD_HELD=4 tests_bwd fence_acq_rel_4 --gtest_filter=-Long/*
    PATHATTN_BWD_FENCE=acq_rel PATHATTN_BWD_HELD=4 sanitize fence_acq_rel_4 build-gpu/tests/cuda/test_cuda_backward \
      "$SMALL_BWD64:CudaBackwardDeterminism.*" 300
  fi
  if command -v cuobjdump >/dev/null; then
    note "MEMBAR / FENCE instructions in bench_fwd's bwd_main kernels: $(cuobjdump -sass build-gpu/bench/cuda/bench_fwd 2>/dev/null |
      awk '/Function : .*bwd_main/{f=1} /Function : /&&!/bwd_main/{f=0} f' | grep -oE 'MEMBAR[A-Z0-9_.]*|FENCE[A-Z0-9_.]*' |
      sort | uniq -c | tr '\n' ' ')"
  fi
  for round in $(seq 1 ${FENCE_ROUNDS:-1}); do
    for v in ${FENCE_VARIANTS:-sc:2 acq_rel:2 sc:4 acq_rel:4}; do
      IFS=';' read -ra fence_shapes <<< "${FENCE_SHAPES:---only 64;--only 128;--shape 8,4096,12,64}"
      for args in "${fence_shapes[@]}"; do
        PATHATTN_BWD_FENCE=${v%%:*} PATHATTN_BWD_HELD=${v##*:} PATHATTN_CUDA_PROFILE=1 \
          build-gpu/bench/cuda/bench_fwd --bwd --iters 5 $args > "$OUT/bench_fence.log" 2>&1
        note "round $round, fence:held $v, bench_fwd --bwd $args: rc=$?"
        python3 tools/bench_stages.py "$OUT/bench_fence.log" | grep -v '^==' | tee -a "$SUMMARY"
      done
    done
  done
fi
if [ "$MODE" = pair ]; then
  tests_bwd pair
  PATHATTN_TEST_BWD_FAST=1 tests_bwd pair_fast --gtest_filter=-Long/*
  sanitize pair build-gpu/tests/cuda/test_cuda_backward "$SMALL_BWD64" 300
  PATHATTN_TEST_BWD_FAST=1 sanitize pair_fast build-gpu/tests/cuda/test_cuda_backward "$SMALL_BWD64" 300
  for v in mma wgmma; do  # wgmma: the default
    PATHATTN_BWD_MAIN=$v PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --only 64 --iters 5 > "$OUT/bench_main_$v.log" 2>&1
    note "bench_fwd --bwd --only 64, main kernel $v: rc=$?"
    grep -E '^ +B|^ +[0-9]' "$OUT/bench_main_$v.log" | tee -a "$SUMMARY"
    python3 tools/bench_stages.py "$OUT/bench_main_$v.log" | tee -a "$SUMMARY"
  done
fi
if [ "$MODE" = local ]; then
  # The worst ratio to its bound per gradient over a test log's cases.
  worst() { awk '/ratio to bound/{r=$NF; sub(/\)/,"",r); if (r+0 > m[$1]+0) m[$1]=r} END{for (k in m) printf "%s %s  ", k, m[k]; print ""}' "$1"; }
  for v in 3x tf32; do
    # (3xTF32 ran the T = 16384 case in every earlier session: left out here for time)
    F=(); [ $v = 3x ] && F=(--gtest_filter=-Long/*)
    PATHATTN_BWD_LOCAL=$v tests_bwd "$v" "${F[@]}"
    note "  worst ratio to bound: $(worst "$OUT/errors_bwd_$v.log")"
  done
  t0=$(date +%s)
  PATHATTN_BWD_LOCAL=tf32 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 build-gpu/tests/cuda/test_cuda_backward \
    --gtest_filter='*B1_T65_H1_HQ4_D64_DV64_betauniform_gate_bf16:*T331_H2_HQ4_D64*varlen7_bf16:*B2_T65_H2_HQ2_D128_DV128_betauniform_f16' \
    > "$OUT/sanitizer_local_tf32.log" 2>&1
  note "compute-sanitizer memcheck (tf32): rc=$?, $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_local_tf32.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
  for v in 3x tf32; do
    PATHATTN_BWD_LOCAL=$v PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --iters 5 > "$OUT/bench_$v.log" 2>&1
    note "bench_fwd --bwd, PATHATTN_BWD_LOCAL=$v: rc=$?"
    grep -E '^ +B|^ +[0-9]' "$OUT/bench_$v.log" | tee -a "$SUMMARY"
    python3 tools/bench_stages.py "$OUT/bench_$v.log" | tee -a "$SUMMARY"
  done
  if [ "${NO_NCU:-0}" != 1 ]; then
    for v in 3x tf32; do
      PATHATTN_BWD_LOCAL=$v timeout 200 ncu --clock-control none -k "regex:bwd_local" --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section InstructionStats build-gpu/bench/cuda/bench_fwd --bwd --iters 1 --shape ${NCU_SHAPE:-8,4096,32,64} > "$OUT/ncu_local_$v.txt" 2>&1
      note "ncu bwd_local ($v): rc=$?"
      grep -E "Duration|Executed Ipc|Issued Ipc|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Stall" "$OUT/ncu_local_$v.txt" | head -24 | tee -a "$SUMMARY"
    done
  fi
fi
if [ "$MODE" = localprof ]; then
  PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --iters 5 > "$OUT/bench_local.log" 2>&1
  note "bench_fwd --bwd: rc=$?"
  grep -E '^ +B|^ +[0-9]' "$OUT/bench_local.log" | tee -a "$SUMMARY"
  python3 tools/bench_stages.py "$OUT/bench_local.log" | tee -a "$SUMMARY"
  for skip in 0 16 32 64 128 256; do
    PATHATTN_BWD_TIMING_SKIP=$skip PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --iters 5 \
      --shape ${LOCAL_SHAPE:-32,4096,32,64} > "$OUT/bench_skip.log" 2>&1
    note "timing skip $skip: bwd det/fast ms $(grep -E '^ +[0-9]' "$OUT/bench_skip.log" | awk '{print $9, $10}') |$(python3 tools/bench_stages.py "$OUT/bench_skip.log" | tail -1 | cut -d'|' -f3-)"
  done
  t0=$(date +%s)
  timeout 300 ncu --clock-control none -k "regex:bwd_local" --launch-skip 1 --launch-count 1 --import-source yes \
    --section WarpStateStats --section SchedulerStats --section SourceCounters --section SpeedOfLight \
    -o "$OUT/local" -f build-gpu/bench/cuda/bench_fwd --bwd --iters 1 --shape ${NCU_SHAPE:-8,4096,32,64} > "$OUT/ncu_local.log" 2>&1
  note "ncu bwd_local: rc=$? ($(( $(date +%s) - t0 )) s)"
  ncu --import "$OUT/local.ncu-rep" --print-summary none | grep -E "Duration|Issued Ipc|No Eligible|Stall|Warp Cycles Per Issued" | head -30 | tee -a "$SUMMARY"
  for src in sass cuda; do
    ncu --import "$OUT/local.ncu-rep" --page source --csv --print-source $src > "$OUT/source_$src.csv" 2> "$OUT/source_$src.err"
    note "source page ($src): rc=$? $(head -c 300 "$OUT/source_$src.err")"
    python3 tools/ncu_source_top.py "$OUT/source_$src.csv" --top 40 2>&1 | tee -a "$SUMMARY"
  done
fi
if [ "$MODE" = wide ]; then
  # The D = 128 wgmma main kernel beside the mma.sync one (a hang shows as a timeout: 200 s per test run).
  WIDE_CASES='*D128*:CudaBackwardDeterminism.*'
  BWD_TEST_TIMEOUT=200 tests_bwd wide --gtest_filter="$WIDE_CASES"
  PATHATTN_TEST_BWD_FAST=1 BWD_TEST_TIMEOUT=200 tests_bwd wide_fast --gtest_filter="$WIDE_CASES"
  sanitize wide build-gpu/tests/cuda/test_cuda_backward \
    '*B2_T65_H2_HQ2_D128_DV128_betauniform_f16:*B1_T97_H2_HQ4_D128_DV128*gate*' 240
  for main in mma wide; do  # wide: the default, PATHATTN_BWD_MAIN=wgmma (at D = 128 the column-split kernel)
    PATHATTN_BWD_MAIN=${main/wide/wgmma} PATHATTN_CUDA_PROFILE=1 timeout 240 build-gpu/bench/cuda/bench_fwd --bwd --only 128 --iters 5 \
      > "$OUT/bench_main_$main.log" 2>&1
    note "bench_fwd --bwd --only 128, main kernel $main: rc=$?"
    grep -E '^ +B|^ +[0-9]' "$OUT/bench_main_$main.log" | tee -a "$SUMMARY"
    python3 tools/bench_stages.py "$OUT/bench_main_$main.log" | tee -a "$SUMMARY"
  done
fi
if [ "$MODE" = bwd ] && [ "${SKIP_BENCH:-0}" != 1 ]; then
  t0=$(date +%s)
  PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --iters 5 --csv "$OUT/ours.csv" > "$OUT/bench.log" 2>&1
  note "bench_fwd --bwd (profiled): rc=$? ($(( $(date +%s) - t0 )) s)"
  # The stage lines of the last profiled call before each table row, then the row.
  awk '/profile\]/{line=line" "$3"="$4} /^ +[0-9]/{print $0; print "   stages:" line; line=""; next} /^#|^ +B/' "$OUT/bench.log" | tee -a "$SUMMARY"
  if [ "${BWD_AB:-0}" = 1 ]; then  # the same with the mma.sync main kernel (bwd_main.cuh) at D = 64
    PATHATTN_BWD_MAIN=mma PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --only 64 --iters 5 > "$OUT/bench_mma.log" 2>&1
    note "bench_fwd --bwd, PATHATTN_BWD_MAIN=mma: rc=$?"
    awk '/profile\]/{line=line" "$3"="$4} /^ +[0-9]/{print $0; print "   stages:" line; line=""; next} /^#|^ +B/' "$OUT/bench_mma.log" | tee -a "$SUMMARY"
  fi
fi
if [ "$MODE" = bwd ]; then
  # Timing variants: each word of BWD_VARIANTS is an environment assignment for one bench_fwd run of one shape,
  # e.g. PATHATTN_BWD_TIMING_SKIP=3 (stages left out, params.h) or PATHATTN_BWD_PAIR_GROUP=4 (plan.cu).
  for var in ${BWD_VARIANTS:-}; do
    env "$var" PATHATTN_CUDA_PROFILE=1 build-gpu/bench/cuda/bench_fwd --bwd --iters 5 \
      --shape ${VARIANT_SHAPE:-32,4096,32,64} > "$OUT/bench_variant.log" 2>&1
    note "$var: bwd det/fast ms $(grep -E '^ +[0-9]' "$OUT/bench_variant.log" | awk '{print $9, $10}') |$(python3 tools/bench_stages.py "$OUT/bench_variant.log" | tail -1 | cut -d'|' -f3-)"
  done
  [ "${NO_NCU:-0}" = 1 ] || { t0=$(date +%s)
  ncu --clock-control none -k "regex:bwd_main|bwd_local" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section ComputeWorkloadAnalysis --section SchedulerStats --section SourceCounters \
    build-gpu/bench/cuda/bench_fwd --bwd --iters 1 --shape ${NCU_SHAPE:-32,4096,32,64} > "$OUT/ncu.txt" 2>&1
  note "ncu (backward): rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Warp Cycles Per Issued|Issued Ipc|No Eligible|Stall|Dynamic Shared" "$OUT/ncu.txt" | head -80 | tee -a "$SUMMARY"; }
fi

if [ "$MODE" = bwdblock ]; then
  for v in ${BWD_BLOCK_VARIANTS:-PATHATTN_BWD_BLOCK=1 PATHATTN_BWD_BLOCK=3 PATHATTN_BWD_BLOCK=2,PATHATTN_TEST_BWD_FAST=1 PATHATTN_BWD_MAIN=mma}; do
    ( export ${v//,/ }; tests_bwd "${v//[=,]/_}" --gtest_filter=-Long/* )
  done
  [ "${BWD_BLOCK_LONG:-1}" = 1 ] && PATHATTN_BWD_BLOCK=8 tests_bwd block8_long --gtest_filter='Long/*'
  for v in ${BWD_BLOCK_SANITIZE:-PATHATTN_BWD_BLOCK=2}; do
    ( export ${v//,/ }; sanitize "bwd_${v//[=,]/_}" build-gpu/tests/cuda/test_cuda_backward "$SMALL_BWD64:*B2_T65_H2_HQ2_D128_DV128_betauniform_f16" 300 )
  done
  for v in ${BWD_BLOCK_BENCH:-PATHATTN_BWD_MAIN=mma PATHATTN_BWD_BLOCK=0 PATHATTN_BWD_BLOCK=4 PATHATTN_BWD_BLOCK=8 PATHATTN_BWD_BLOCK=16 PATHATTN_BWD_BLOCK=-1}; do
    env ${v//,/ } PATHATTN_CUDA_PROFILE=1 timeout 200 build-gpu/bench/cuda/bench_fwd --bwd ${BWD_BLOCK_BENCH_ARGS:---only 0 --iters 3} \
      > "$OUT/bench_bwd_$v.log" 2>&1
    note "bench_fwd --bwd ${BWD_BLOCK_BENCH_ARGS:---only 0 --iters 3}, $v: rc=$?"
    grep -E '^#|^ +B|^ +[0-9]' "$OUT/bench_bwd_$v.log" | tee -a "$SUMMARY"
    python3 tools/bench_stages.py "$OUT/bench_bwd_$v.log" | tee -a "$SUMMARY"
  done
fi

if [ "$MODE" = ab ]; then
  builds=(build-gpu)
  for d in third_party_fetched/ab/*/; do
    [ -f "$d/CMakeLists.txt" ] || continue
    name=$(basename "$d")
    t0=$(date +%s)
    { cmake -S "$d" -B "build-ab-$name" -DPATHATTN_TORCH=OFF -DPATHATTN_CUDA=ON -DPATHATTN_TESTS=OFF -DPATHATTN_BENCH=ON \
        -DCMAKE_CUDA_COMPILER=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) && make -C "build-ab-$name" -j16 bench_fwd; } \
      > "$OUT/build_ab_$name.log" 2>&1
    rc=$?
    note "ab build $name: rc=$rc ($(( $(date +%s) - t0 )) s)"
    [ $rc = 0 ] && builds+=("build-ab-$name") && spill_map "build-ab-$name"
  done
  for round in $(seq "${AB_ROUNDS:-2}"); do
    for b in "${builds[@]}"; do
      t0=$(date +%s)
      PATHATTN_CUDA_PROFILE=1 "$b/bench/cuda/bench_fwd" --bwd --iters 5 ${AB_ARGS:---only 64} > "$OUT/bench_ab.log" 2>&1
      note "ab round $round, $b: rc=$? ($(( $(date +%s) - t0 )) s)"
      grep -E '^ +B|^ +[0-9]' "$OUT/bench_ab.log" | tee -a "$SUMMARY"
      python3 tools/bench_stages.py "$OUT/bench_ab.log" | tee -a "$SUMMARY"
    done
  done
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  t0=$(date +%s)
  build-gpu/bench/cuda/bench_fwd --bwd --csv "$OUT/ours.csv" > "$OUT/bench.log" 2>&1
  note "bench_fwd: rc=$? ($(( $(date +%s) - t0 )) s)"
  cat "$OUT/bench.log"
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT/third_party_fetched/fla timeout 400 python3 bench/cuda/baselines.py \
    --ours "$OUT/ours.csv" --md "$OUT/table.md" >> "$OUT/bench.log" 2>&1
  note "baselines: rc=$? ($(( $(date +%s) - t0 )) s)"
fi

if [ "$MODE" = torch ]; then
  # The torch extension and the C++ model against the machine's torch; pytest; forward+backward and peak memory
  # beside SDPA and fla (bench/cuda/bench_train.py); one training step of PaTH vs RoPE (model/bench_step_main.cpp).
  t0=$(date +%s)
  if TORCH_TESTS=$HAVE_GTEST build_torch torch_build.log pathattn_torch bench_step; then
    note "torch extension + model build: ok ($(( $(date +%s) - t0 )) s)"
    LIB=$(find build-gpu-torch -name 'libpathattn_torch.so' | head -1)
    t0=$(date +%s)
    PATHATTN_LIBRARY=$LIB PYTHONPATH=$ROOT/python:$ROOT/third_party_fetched/fla timeout ${PYTEST_TIMEOUT:-420} python3 -m pytest -q ${PYTEST_ARGS:-tests/python} > "$OUT/pytest.log" 2>&1
    note "pytest (torch $(python3 -c 'import torch;print(torch.__version__)')): $(tail -1 "$OUT/pytest.log") ($(( $(date +%s) - t0 )) s)"
    # The model's KV-cache decoding through the CUDA decode kernels (gtest, label gpu), built apart so that a
    # failure here leaves the benchmarks below running.
    t0=$(date +%s)
    if [ "$HAVE_GTEST" = ON ] && make -C build-gpu-torch -j16 test_model_cuda > "$OUT/model_cuda_build.log" 2>&1; then
      timeout 300 build-gpu-torch/tests/test_model_cuda > "$OUT/model_cuda_tests.log" 2>&1
      note "test_model_cuda: rc=$?, $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/model_cuda_tests.log" | tr '\n' ' ')($(( $(date +%s) - t0 )) s)"
      grep -E '^\[  FAILED  \]' "$OUT/model_cuda_tests.log" | head -20 | tee -a "$SUMMARY"
    else
      note "test_model_cuda: not built (googletest: $HAVE_GTEST; see model_cuda_build.log)"
    fi
    # The layer's fused w path beside the torch composition it replaced (a few seconds).
    t0=$(date +%s)
    for sc in rows vec; do  # PATHATTN_SHORT_CONV: the row per warp, the vector form (the default)
      PYTHONUNBUFFERED=1 PATHATTN_SHORT_CONV=$sc PATHATTN_LIBRARY=$LIB PYTHONPATH=$ROOT/python timeout 120 \
        python3 bench/cuda/bench_short_conv.py > "$OUT/short_conv_bench.log" 2>&1
      note "bench_short_conv.py, PATHATTN_SHORT_CONV=$sc: rc=$? ($(( $(date +%s) - t0 )) s)"
      tee -a "$SUMMARY" < "$OUT/short_conv_bench.log"
    done
    if [ "${DECODE_BENCH:-0}" = 1 ]; then
      t0=$(date +%s)
      PYTHONUNBUFFERED=1 PATHATTN_LIBRARY=$LIB PYTHONPATH=$ROOT/python:$ROOT/third_party_fetched/fla \
        timeout ${DECODE_BENCH_TIMEOUT:-200} python3 bench/cuda/bench_decode.py --md "$OUT/decode.md" ${DECODE_BENCH_ARGS:-} \
        > "$OUT/decode_bench.log" 2>&1
      note "bench_decode.py: rc=$? ($(( $(date +%s) - t0 )) s)"
      grep -vE "^\s*$" "$OUT/decode_bench.log" | tail -40 | tee -a "$SUMMARY"
    fi
    if [ "${DECODE_DRIFT:-0}" = 1 ]; then
      t0=$(date +%s)
      PYTHONUNBUFFERED=1 PATHATTN_LIBRARY=$LIB PYTHONPATH=$ROOT/python \
        timeout ${DECODE_DRIFT_TIMEOUT:-240} python3 bench/cuda/decode_drift.py ${DECODE_DRIFT_ARGS:-} > "$OUT/decode_drift.log" 2>&1
      note "decode_drift.py: rc=$? ($(( $(date +%s) - t0 )) s)"
      tee -a "$SUMMARY" < "$OUT/decode_drift.log"
    fi
    if [ "${SKIP_TRAIN_BENCH:-0}" != 1 ]; then
      t0=$(date +%s)
      PYTHONUNBUFFERED=1 PATHATTN_LIBRARY=$LIB PYTHONPATH=$ROOT/python:$ROOT/third_party_fetched/fla \
        timeout ${TRAIN_BENCH_TIMEOUT:-300} python3 bench/cuda/bench_train.py --budget-s ${TRAIN_BENCH_BUDGET:-200} \
        --md "$OUT/train.md" --csv "$OUT/train.csv" ${TRAIN_BENCH_ARGS:-} > "$OUT/train.log" 2>&1
      note "bench_train: rc=$? ($(( $(date +%s) - t0 )) s)"
      tee -a "$SUMMARY" < "$OUT/train.md"  # in the summary too: a call brings back only a few of $OUT's files
    fi
    [ "${SKIP_TRAIN_BENCH:-0}" != 1 ] && [ "${SKIP_STEP_BENCH:-0}" != 1 ] && run_bench_step
  else
    note "torch extension build FAILED (see torch_build.log)"; tail -20 "$OUT/torch_build.log"
  fi
fi

echo "==== summary"
cat "$SUMMARY"
[ -f "$OUT/train.md" ] && cat "$OUT/train.md"
[ -f "$OUT/table.md" ] && cat "$OUT/table.md"
exit 0
