#!/usr/bin/env bash
# The GPU side of issue 12 (docs/results/lm/README.md): PaTH vs RoPE vs FoX language models on the kernel data,
# in device commands of at most 10 minutes each, run from the repository root on the GPU machine.
#
#   tools/lm_gpu.sh build                 pathattn_train, pathattn_lm_eval, bench_step and the torch op library (for
#                                         bench/cuda/bench_train.py) against the machine's torch with the CUDA op
#                                         (build-gpu-torch, as gpu_check.sh's torch and model modes)
#   tools/lm_gpu.sh unpack PART [PART..]  data parts of tools/lm_pack.py into $LM_DATA
#   tools/lm_gpu.sh probe [RUN ..]        one training step per mechanism of the runs (default LM_PROBE) at this
#                                         configuration (bench_step): tokens/s; with LM_TRAIN_BUDGET (seconds of GPU
#                                         time for training these runs together) it also writes the steps that fit
#                                         to $LM_RUNS/steps.txt, which LM_STEPS=auto
#                                         then uses (the calls follow each other within the machine's 30 s idle
#                                         release: nothing can be computed by hand between them)
#   tools/lm_gpu.sh train RUN [RUN ..]    trains the runs side by side, run i on GPU i mod (GPUs), each for at most
#                                         LM_TIME_LIMIT seconds, then checkpoints; call again to continue (--resume)
#   tools/lm_gpu.sh eval RUN [RUN ..]     pathattn_lm_eval of each run's final checkpoint (valid at T, loss by position)
#   tools/lm_gpu.sh status | collect      steps done per run | metrics, evaluations, logs into $OUT/lm.tgz (one file:
#                                         a call brings back at most 8 files, none more than 2 folders down)
# RUN: path | path-fox | rope | fox | nope, or path-from-rope / path-fox-from-rope: the paper's conversion, PaTH started
# from rope's final checkpoint (--init-from) and trained LM_CONVERT_STEPS more steps. A suffix -s<N> (path-s2, rope-s2)
# is the same run with --seed N (initialisation and data order): the seed spread, trained beside the others.
#
# Every run of one configuration uses the same data (the first LM_TRAIN_SHARDS train shards), the same seed and the
# same steps, so the mechanisms see the same batches in the same order. train and eval end with collect.
set -uo pipefail
cd "$(dirname "$0")/.."
CMD=${1:-}; shift || true

# The configuration (the same for every mechanism; override by environment, and keep it for every call of a run:
# a resume with another schedule or data is refused).
: "${LM_DATA:=data/lm}" "${LM_RUNS:=runs/lm}" "${LM_TRAIN_SHARDS:=16}"
: "${LM_WIDTH:=512}" "${LM_LAYERS:=8}" "${LM_HEADS:=8}" "${LM_T:=1024}" "${LM_BATCH:=64}" "${LM_ACCUM:=1}"
: "${LM_STEPS:=2000}" "${LM_LR:=1e-3}" "${LM_WARMUP:=200}" "${LM_EVAL_EVERY:=250}" "${LM_EVAL_SIZE:=256}"
: "${LM_CONVERT_STEPS:=400}" "${LM_CONVERT_LR:=5e-4}" "${LM_CONVERT_WARMUP:=50}"
: "${LM_TIME_LIMIT:=480}" "${LM_THREADS:=4}" "${LM_EXTRA:=}" "${LM_PROBE:=path,path-fox,rope,fox}"
# Steps between checkpoints (and always when a run stops: its end or LM_TIME_LIMIT); 0 = only then. The periodic
# ones keep a run that is killed (timeout) from starting over; the issue-12 runs of 2026-12-02 used 0, before the
# fix of the second-checkpoint crash (model/dir_ops.h) had passed ckpt-repro on the GPU machine (it has since).
: "${LM_CKPT_EVERY:=500}"
: "${LM_EVAL_LENGTH:=$((16 * LM_T))}" "${LM_EVAL_WINDOWS:=32}" "${LM_EVAL_BATCH:=1}"
# LM_DEVICE / LM_PRECISION / LM_BUILD let the same script run a tiny configuration on the CPU (how it was checked).
: "${LM_DEVICE:=cuda}" "${LM_PRECISION:=bf16}" "${LM_BUILD:=build-gpu-torch}"
BUILD=$LM_BUILD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

gpus() { nvidia-smi -L 2>/dev/null | wc -l; }

# LM_STEPS=auto: the steps probe chose for LM_TRAIN_BUDGET.
steps_of() {
  if [ "$LM_STEPS" = auto ]; then
    [ -f "$LM_RUNS/steps.txt" ] || { echo "LM_STEPS=auto but no $LM_RUNS/steps.txt: run probe with LM_TRAIN_BUDGET" >&2; return 2; }
    head -1 "$LM_RUNS/steps.txt"
  else
    echo "$LM_STEPS"
  fi
}

# A run's mechanism and seed: path-fox-s2 -> path-fox, 2 (no suffix: the trainer's default seed, or LM_EXTRA's).
mech_of() { local m=$1; [[ $m =~ ^(.*)-s([0-9]+)$ ]] && m=${BASH_REMATCH[1]}; echo "${m%-from-rope}"; }
seed_of() { [[ $1 =~ -s([0-9]+)$ ]] && echo "${BASH_REMATCH[1]}"; }

run_args() {  # run name -> pathattn_train arguments
  local run=$1 mech steps lr=$LM_LR warmup=$LM_WARMUP init=() seed=()
  mech=$(mech_of "$run"); steps=$(steps_of)
  [ -n "$(seed_of "$run")" ] && seed=(--seed "$(seed_of "$run")")
  case "$run" in
    *-from-rope)
      steps=$LM_CONVERT_STEPS; lr=$LM_CONVERT_LR; warmup=$LM_CONVERT_WARMUP
      init=(--init-from "$LM_RUNS/rope/ckpt") ;;
  esac
  echo --task lm --lm-data "$LM_DATA" --lm-seq-len "$LM_T" --lm-train-shards "$LM_TRAIN_SHARDS" \
    --mechanism "$mech" --width "$LM_WIDTH" --layers "$LM_LAYERS" --heads "$LM_HEADS" \
    --batch "$LM_BATCH" --grad-accum "$LM_ACCUM" --steps "$steps" --lr "$lr" --warmup "$warmup" \
    --eval-every "$LM_EVAL_EVERY" --eval-size "$LM_EVAL_SIZE" --eval-batch 16 --log-every 50 --ckpt-every "$LM_CKPT_EVERY" \
    --device "$LM_DEVICE" --precision "$LM_PRECISION" --threads "$LM_THREADS" --out "$LM_RUNS/$run" "${init[@]}" \
    "${seed[@]}" $LM_EXTRA
}

collect() {
  [ -n "${OUT:-}" ] || return 0
  rm -rf "$OUT/lm"
  for d in "$LM_RUNS"/*/; do
    [ -d "$d" ] || continue
    local run; run=$(basename "$d")
    mkdir -p "$OUT/lm/$run"
    cp -f "$d"/metrics.csv "$d"/metrics.json "$d"/init_report.txt "$d"/train.log "$OUT/lm/$run/" 2>/dev/null
    [ -d "$d/eval" ] && cp -rf "$d/eval" "$OUT/lm/$run/"
    cp -f "$d/ckpt/data.txt" "$d/ckpt/config.txt" "$d/ckpt/step.txt" "$OUT/lm/$run/" 2>/dev/null
  done
  cp -f "$LM_DATA/stats.json" "$LM_RUNS/steps.txt" "$LM_RUNS/probe.csv" "$OUT/lm/" 2>/dev/null
  tar czf "$OUT/lm.tgz" -C "$OUT" lm && rm -rf "$OUT/lm"
  return 0
}

status() {
  for d in "$LM_RUNS"/*/; do
    [ -f "$d/ckpt/step.txt" ] && echo "$(basename "$d"): step $(head -1 "$d/ckpt/step.txt")" \
      "of $(grep -o 'steps [0-9]*' "$d/ckpt/data.txt" | head -1 | cut -d' ' -f2)"
  done
}

case "$CMD" in
  build)
    t0=$(date +%s)
    # CLI11 (header-only) for the two programs: the GPU image has none, so a copy of Debian's /usr/include/CLI travels.
    cli=(); [ -f third_party_fetched/cli11/CLI/CLI.hpp ] &&
      cli=(-DPATHATTN_CLI11_INCLUDE="$PWD/third_party_fetched/cli11")
    cmake -S . -B $BUILD -DPATHATTN_TORCH=ON -DPATHATTN_CUDA=ON -DPATHATTN_TESTS=OFF -DPATHATTN_BENCH=OFF \
      -DCMAKE_BUILD_TYPE=Release "${cli[@]}" \
      -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')" \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" > /tmp/lm_build.log 2>&1 &&
      make -C $BUILD -j"$(nproc)" pathattn_train pathattn_lm_eval bench_step pathattn_torch >> /tmp/lm_build.log 2>&1
    rc=$?
    echo "lm build: rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || { tail -30 /tmp/lm_build.log; exit $rc; }
    ;;
  unpack)
    python3 tools/lm_unpack.py "$@" --into "$LM_DATA" || exit 1
    ls "$LM_DATA" | sed -n '1,3p;$p'; echo "train shards: $(ls "$LM_DATA"/train-*.tok 2>/dev/null | wc -l)"
    ;;
  probe)
    # One step of LM_BATCH sequences (a micro-batch); a step of the run is LM_ACCUM of them. Each mechanism is timed
    # once; the budget counts it once per run that uses it (path and path-s2 both cost a path step).
    mkdir -p "$LM_RUNS"
    [ $# -ge 1 ] || IFS=, read -r -a probe_runs <<< "$LM_PROBE"
    [ $# -ge 1 ] && probe_runs=("$@")
    mechs=(); for run in "${probe_runs[@]}"; do mechs+=("$(mech_of "$run")"); done
    unique=$(printf '%s\n' "${mechs[@]}" | awk '!seen[$0]++' | paste -sd,)
    timeout 300 $BUILD/model/bench_step --device "$LM_DEVICE" --precision "$LM_PRECISION" \
      --mechanisms "$unique" --width "$LM_WIDTH" --layers "$LM_LAYERS" \
      --heads "$LM_HEADS" --mlp 0 --T "$LM_T" --batch "$LM_BATCH" --vocab "${LM_VOCAB:-8192}" --warmup 3 --steps 5 \
      --csv "$LM_RUNS/probe.csv" || exit 1
    if [ -n "${LM_TRAIN_BUDGET:-}" ]; then
      # The runs share the GPU (one per GPU when there are as many), so N steps of every run take N x the sum of
      # their step times on one GPU; 10% is left for evaluations and checkpoints.
      python3 - "$LM_RUNS/probe.csv" "$LM_TRAIN_BUDGET" "$LM_ACCUM" "$(gpus)" "${mechs[@]}" > "$LM_RUNS/steps.txt" <<'PY' || exit 1
import csv, sys
ms = {r["mechanism"]: float(r["step_ms_median"]) for r in csv.DictReader(open(sys.argv[1])) if r["step_ms_median"]}
budget, accum, gpus, runs = float(sys.argv[2]), int(sys.argv[3]), max(1, int(sys.argv[4])), sys.argv[5:]
missing = [m for m in runs if m not in ms]
if missing: sys.exit(f"probe: no step time for {missing}")
per_step = sum(ms[m] for m in runs) / 1e3 * accum / min(gpus, len(runs))
print(max(1, int(0.9 * budget / per_step)))
print(f"# {len(runs)} runs ({' '.join(runs)}), {per_step:.3f} s of GPU per step of all of them, budget {budget:g} s")
PY
      echo "steps for LM_TRAIN_BUDGET=$LM_TRAIN_BUDGET s: $(head -1 "$LM_RUNS/steps.txt") ($(tail -1 "$LM_RUNS/steps.txt"))"
    fi
    ;;
  train)
    [ $# -ge 1 ] || { echo "usage: $0 train RUN [RUN ...]" >&2; exit 2; }
    steps_of > /dev/null || exit 2
    n=$(gpus); [ "$n" -ge 1 ] || n=1
    runs=("$@"); i=0; pids=()
    for run in "${runs[@]}"; do
      mkdir -p "$LM_RUNS/$run"
      # shellcheck disable=SC2046
      CUDA_VISIBLE_DEVICES=$((i % n)) timeout $((LM_TIME_LIMIT + 100)) $BUILD/model/pathattn_train $(run_args "$run") \
        --resume --time-limit "$LM_TIME_LIMIT" >> "$LM_RUNS/$run/train.log" 2>&1 &
      pids+=($!); i=$((i + 1))
    done
    rc=0
    for k in "${!pids[@]}"; do
      wait "${pids[$k]}"; r=$?; [ $r = 0 ] || rc=$r
      run=${runs[$k]}
      echo "== $run (rc $r)"; grep -E '\] (step|eval|stopp|done|resumed|init)' "$LM_RUNS/$run/train.log" | tail -4
    done
    status; collect; exit $rc
    ;;
  eval)
    rc=0
    for run in "$@"; do
      timeout 500 $BUILD/model/pathattn_lm_eval --ckpt "$LM_RUNS/$run/ckpt" --data "$LM_DATA" \
        --out "$LM_RUNS/$run/eval" --length "$LM_EVAL_LENGTH" --windows "$LM_EVAL_WINDOWS" --batch "$LM_EVAL_BATCH" \
        --device "$LM_DEVICE" --precision "$LM_PRECISION" --threads "$LM_THREADS" \
        > "$LM_RUNS/$run/eval.log" 2>&1 || rc=1
      grep -E 'valid|positions|pathattn' "$LM_RUNS/$run/eval.log"
    done
    collect; exit $rc
    ;;
  status) status ;;
  collect) collect ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
