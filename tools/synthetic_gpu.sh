#!/usr/bin/env bash
# The GPU side of issue 14 (docs/results/synthetic/README.md): the synthetic sweep (A5, MQRAR-N, flip-flop; path,
# path-fox, rope, fox; 3 seeds) in device commands of at most 10 minutes each, run from the repository root on the
# GPU machine. tools/sweep_synthetic.py does the work; this script fixes the folders and the machine's options.
#
#   tools/synthetic_gpu.sh build           pathattn_train, pathattn_generate and bench_step against the machine's torch with the CUDA op
#                                          (build-gpu-torch, as lm_gpu.sh and gpu_check.sh build it)
#   tools/synthetic_gpu.sh probe           step times of every cell shape on the GPU (bench_step, bf16, 5 + 20 steps),
#                                          to gpu_steps.csv, then the plan with them ($OUT/synthetic.tgz)
#   tools/synthetic_gpu.sh run [OPTIONS]   the sweep for SYN_BUDGET seconds: the unfinished cells, SYN_JOBS_PER_GPU
#                                          at a time on each GPU; finished cells skipped, stopped ones resumed from
#                                          their checkpoints (in SYN_RUNS, kept while the machine is held); metrics of
#                                          every cell that ends, and summary.csv, into $OUT/synthetic.tgz.
#                                          OPTIONS go to sweep_synthetic.py run (e.g. --only 'a5-len20', --set ...)
#   tools/synthetic_gpu.sh status          cells finished / started / not started per task
#   tools/synthetic_gpu.sh generate        the main job's flip-flop PaTH model (tools/run_demo.sh's settings, width 128) trained on
#                                          cuda, then pathattn_generate --device cuda on its checkpoint: the reads it
#                                          answers through the CUDA decode (--eval-reads 256) and tokens/s of batched
#                                          sampling (issue 11's generate program on the GPU); logs to $OUT/generate.txt
#   tools/synthetic_gpu.sh ckpt-repro      a tiny flip-flop run that checkpoints every 2 steps, on cuda and on the
#                                          cpu, ok / FAILED for each (gdb's backtrace on a failure where the machine has
#                                          gdb): the second checkpoint of a process ended every GPU cell with SIGSEGV
#                                          on 2026-12-02 (docs/results/synthetic)
#
# SYN_DRAIN=1 (run): the session's last call starts only the cells that can finish within SYN_BUDGET at their depth's
# measured rate, scaled to SYN_JOBS_PER_GPU from the sharing each finished cell ran with (sweep_synthetic.py --drain;
# cells finished before 2026-12-07's thirty-sixth session record no sharing and count as measured); the others wait
# for the next session instead of being cut off.
#
# SYN_END=<epoch seconds> (run): the device call's end; the budget is cut to end 30 s before it (the sweep then stops
# its cells and writes their checkpoints before the call is killed). Set it first in the call's command:
# `export SYN_END=$(( $(date +%s) + 590 )); tools/synthetic_gpu.sh build && ... run` (the twenty-ninth session's
# build took 187 s on a fresh machine, and a fixed SYN_BUDGET after it overran the call's 600 s: killed, nothing back).
#
# SYN_MPS=1 runs the cells under CUDA MPS (a control daemon started for the call and stopped after it): processes
# sharing a GPU are otherwise time-sliced, one at a time (measured 2026-12-02: 4 MQRAR cells 72 steps/s in all, 12 no
# more than 4); under MPS their small kernels run concurrently (ninth session: 5 MQRAR cells ~85-90 steps/s in all).
#
# Cells finished in earlier sessions and committed under SYN_DONE (docs/results/synthetic/cells) are skipped and
# enter the summary. SYN_DEVICE / SYN_BUILD / SYN_GRID let the same script run the tiny grid on the CPU (how it was
# checked: SYN_DEVICE=cpu SYN_BUILD=build-syn SYN_GRID=tiny SYN_BUDGET=0 tools/synthetic_gpu.sh run).
set -uo pipefail
cd "$(dirname "$0")/.."
CMD=${1:-}; shift || true

: "${SYN_RUNS:=runs/synthetic}" "${SYN_DONE:=docs/results/synthetic/cells}" "${SYN_TASKS:=flipflop,mqrar,a5}"
: "${SYN_BUDGET:=540}" "${SYN_JOBS_PER_GPU:=4}" "${SYN_GRID:=paper}"
: "${SYN_DEVICE:=cuda}" "${SYN_BUILD:=build-gpu-torch}"
# Steps between checkpoints: -1 = each cell's evaluation interval (sweep_synthetic.py's default); 0 = only when a
# run stops (its end or the call's time limit). The second-checkpoint crash of the GPU machine (model/dir_ops.h) is
# fixed: ckpt-repro passed there on cuda and cpu (2026-12-02, seventh session).
: "${SYN_CKPT_EVERY:=-1}"
# What comes back: every ended cell's files and summary.csv, gathered on the machine (kept while it is held, so a
# later call's archive holds the earlier calls' cells too) and packed into $OUT by pack.
RESULTS=$SYN_RUNS-results/synthetic
BUILD=$SYN_BUILD
done_args=(); [ -d "$SYN_DONE" ] && done_args=(--also-done "$SYN_DONE")
sweep=(python3 tools/sweep_synthetic.py)

# A device call brings back at most 8 files, none more than 2 folders down: the results folder goes back as one
# $OUT/synthetic.tgz (when OUT is set).
pack() {
  [ -n "${OUT:-}" ] && [ -d "$RESULTS" ] || return 0
  mkdir -p "$OUT"
  tar czf "$OUT/synthetic.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
}

case "$CMD" in
  build)
    t0=$(date +%s)
    # CLI11 (header-only) for pathattn_train: the GPU image has none, so a copy of Debian's /usr/include/CLI travels.
    cli=(); [ -f third_party_fetched/cli11/CLI/CLI.hpp ] &&
      cli=(-DPATHATTN_CLI11_INCLUDE="$PWD/third_party_fetched/cli11")
    cmake -S . -B "$BUILD" -DPATHATTN_TORCH=ON -DPATHATTN_CUDA=ON -DPATHATTN_TESTS=OFF -DPATHATTN_BENCH=OFF \
      -DCMAKE_BUILD_TYPE=Release "${cli[@]}" \
      -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')" \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" > /tmp/syn_build.log 2>&1 &&
      make -C "$BUILD" -j"$(nproc)" pathattn_train pathattn_generate bench_step >> /tmp/syn_build.log 2>&1
    rc=$?
    echo "synthetic build: rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || { tail -30 /tmp/syn_build.log; exit $rc; }
    ;;
  probe)
    mkdir -p "$RESULTS"
    timeout 500 "${sweep[@]}" measure --grid "$SYN_GRID" --tasks "$SYN_TASKS" --build "$BUILD" \
      --device "$SYN_DEVICE" --threads 4 --concurrent "$SYN_JOBS_PER_GPU" --out "$RESULTS/gpu_steps.csv" "$@" || exit 1
    "${sweep[@]}" plan --grid "$SYN_GRID" --tasks "$SYN_TASKS" --steps-csv "$RESULTS/gpu_steps.csv" \
      --gpus "$(nvidia-smi -L 2>/dev/null | wc -l)" --jobs-per-gpu "$SYN_JOBS_PER_GPU" | tee "$RESULTS/plan.md"
    pack
    ;;
  run)
    mkdir -p "$SYN_RUNS" "$RESULTS"
    # SYN_DRAIN=1 for the session's last call: only cells that can finish in SYN_BUDGET start (sweep --drain); the
    # stopped cells' checkpoints go with the machine, so a cell cut off there is lost work.
    drain=(); [ "${SYN_DRAIN:-0}" = 1 ] && drain=(--drain)
    if [ -n "${SYN_END:-}" ]; then
      left=$(( SYN_END - $(date +%s) - 30 ))
      [ "$left" -lt "$SYN_BUDGET" ] && SYN_BUDGET=$(( left > 1 ? left : 1 ))
      echo "SYN_END: budget $SYN_BUDGET s"
    fi
    if [ "${SYN_MPS:-0}" = 1 ] && command -v nvidia-cuda-mps-control > /dev/null; then
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d && echo "MPS: control daemon started" && trap 'echo quit | nvidia-cuda-mps-control' EXIT
    fi
    "${sweep[@]}" run --grid "$SYN_GRID" --tasks "$SYN_TASKS" --build "$BUILD" --runs "$SYN_RUNS" \
      --results "$RESULTS" "${done_args[@]}" --device "$SYN_DEVICE" --jobs-per-gpu "$SYN_JOBS_PER_GPU" \
      --budget "$SYN_BUDGET" --ckpt-every "$SYN_CKPT_EVERY" "${drain[@]}" "$@" 2>&1 | tee -a "$RESULTS/sweep.log"
    rc=${PIPESTATUS[0]}
    # The status of the same grid: run's --only and --set shape it (a --set a5.bos=... run read against the plain
    # grid stops at its first cell as "recorded with other options"); its other options are run's alone.
    grid_opts=(); args=("$@")
    for ((i = 0; i < ${#args[@]}; i++)); do
      case "${args[i]}" in
        --only|--set) grid_opts+=("${args[i]}" "${args[i + 1]:-}"); i=$((i + 1)) ;;
        --only=*|--set=*) grid_opts+=("${args[i]}") ;;
      esac
    done
    "${sweep[@]}" status --grid "$SYN_GRID" --tasks "$SYN_TASKS" --runs "$SYN_RUNS" "${done_args[@]}" "${grid_opts[@]}"
    pack
    exit "$rc"
    ;;
  ckpt-repro)
    # Passes when the run ends normally and leaves its ckpt/ and metrics, no ckpt.old / ckpt.tmp (a crash in the
    # second save left ckpt.old behind).
    fails=0
    for dev in cuda cpu; do
      d=/tmp/ckpt-repro-$dev; rm -rf "$d"
      run=("$BUILD/model/pathattn_train" --task flipflop --mechanism rope --layers 1 --width 32 --heads 2 --batch 4
           --steps 6 --eval-every 2 --eval-size 16 --eval-batch 8 --ckpt-every 2 --log-every 2 --ff-pairs 8
           --out "$d" --device "$dev")
      "${run[@]}" > "$d.log" 2>&1
      rc=$?
      left=$(ls "$d" 2>/dev/null | tr '\n' ' ')
      if [ $rc = 0 ] && [ "$left" = "ckpt metrics.csv metrics.json " ]; then verdict=ok; else verdict=FAILED; fails=1; fi
      echo "ckpt-repro $dev: $verdict (rc $rc; left: $left)"
      if [ $verdict = FAILED ]; then
        tail -5 "$d.log"
        command -v gdb > /dev/null && gdb -q -batch -ex run -ex bt --args "${run[@]}" 2>&1 | grep -vE '^\[(New )?Thread' | tail -40
      fi
    done
    exit $fails
    ;;
  generate)
    # The demo's PaTH model (tools/run_demo.sh's settings but the width: 128, so that the heads are D = 64, which the
    # CUDA kernels take; the demo's 64 / 2 heads = D 32 was refused there, twelfth session) on cuda; then
    # generation through the CUDA decode kernels.
    d=/tmp/gen-demo; rm -rf "$d"
    log=${OUT:-/tmp}/generate.txt; mkdir -p "$(dirname "$log")"
    t0=$(date +%s)
    "$BUILD/model/pathattn_train" --task flipflop --mechanism path --layers 1 --heads 2 --width 128 --batch 16 \
      --steps 600 --lr 3e-3 --warmup 50 --eval-every 150 --eval-size 256 --log-every 100 --seed 1 --device "$SYN_DEVICE" \
      --out "$d" > "$log" 2>&1
    rc=$?
    echo "generate: training rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$log"
    [ $rc = 0 ] || { tail -20 "$log"; exit $rc; }
    t0=$(date +%s)
    "$BUILD/model/pathattn_generate" --ckpt "$d" --eval-reads 256 --device "$SYN_DEVICE" >> "$log" 2>&1
    rc1=$?
    "$BUILD/model/pathattn_generate" --ckpt "$d" --sample 64 --tokens 256 --temperature 0.8 --top-k 2 \
      --device "$SYN_DEVICE" >> "$log" 2>&1
    rc2=$?
    echo "generate: eval-reads rc=$rc1, sample rc=$rc2 ($(( $(date +%s) - t0 )) s)" | tee -a "$log"
    grep -iE "reads|tok/s|tokens/s|error" "$log" | tail -12
    [ $rc1 = 0 ] && [ $rc2 = 0 ]
    ;;
  status) "${sweep[@]}" status --grid "$SYN_GRID" --tasks "$SYN_TASKS" --runs "$SYN_RUNS" "${done_args[@]}" ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
