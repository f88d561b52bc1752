#!/usr/bin/env bash
# The model demo: flip-flop language modelling (Liu et al. 2023) with 1-layer 2-head models, PaTH against
# RoPE and FoX, trained on the CPU; prints the error table beside the PaTH paper's numbers and writes a plot, then
# scores the PaTH checkpoint's reads answered by generation (pathattn_generate --eval-reads).
# About 5 minutes on 2 idle cores, 10 under a concurrent build (see docs/model.md for the measured time and the recorded results).
#
#   tools/run_demo.sh [BUILD_DIR] [pathattn_train options...]
#
# BUILD_DIR defaults to <repo>/build (pathattn_train is BUILD_DIR/model/pathattn_train). Extra options are
# passed to every run and override the defaults below (e.g. --steps 300, or --task a5 --a5-length 16).
# Environment: MECHANISMS (default "path rope fox"), OUT (default BUILD_DIR/demo).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo/build"
if [[ $# -gt 0 && "$1" != -* ]]; then
  build="$(cd "$1" && pwd)"
  shift
fi
bin="$build/model/pathattn_train"
if [[ ! -x "$bin" ]]; then
  echo "run_demo.sh: $bin not found; build first (cmake -B $build && make -C $build -j2 pathattn_train pathattn_generate)" >&2
  exit 1
fi
mechanisms="${MECHANISMS:-path rope fox}"
out="${OUT:-$build/demo}"
threads="$(nproc)"
export OMP_NUM_THREADS="$threads"
# Passive OpenMP waiting: on a shared 2-core machine a spinning thread whose partner is descheduled made
# training 3x slower (9.5k vs 26k tokens/s measured under a concurrent build); idle it costs little.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
mkdir -p "$out"

# Tuned on this project's 2-core machine (docs/model.md): PaTH reaches 0% in-distribution error within
# about 100 steps; the budget is spent giving the softmax baselines the same number of steps.
defaults=(--task flipflop --layers 1 --heads 2 --width 64 --batch 16 --steps 600 --lr 3e-3 --warmup 50
          --eval-every 150 --eval-size 256 --log-every 100 --seed 1 --threads "$threads")

start=$(date +%s)
runs=()
for m in $mechanisms; do
  echo "== $m =="
  "$bin" "${defaults[@]}" --mechanism "$m" --out "$out/$m" "$@" | tee "$out/$m.log"
  runs+=("$out/$m")
done
end=$(date +%s)

# The task of the runs (the last --task given wins, as in pathattn_train).
task=flipflop
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; ++i)); do [[ "${args[i]}" == --task ]] && task="${args[i + 1]}"; done

echo
if [[ "$task" == flipflop ]]; then
  echo "Flip-flop error on the bits after reads (in_dist p_i = 0.8, sparse 0.98, dense 0.1), $(nproc) cores,"
  echo "total wall time $((end - start)) s. Paper (PaTH, Yang et al. 2025): PaTH 0%, RoPE 6.9% in distribution."
  paper=(--paper path=0 rope=6.9)
else
  echo "$task: error on the scored positions, $(nproc) cores, total wall time $((end - start)) s."
  paper=()
fi
/usr/bin/python3 "$repo/tools/plot_metrics.py" "${runs[@]}" --out "$out/$task.png" --table \
  --title "$task" "${paper[@]}" | tee "$out/table.md"
echo "plot: $out/$task.png   metrics: $out/<mechanism>/metrics.{csv,json}   checkpoints: $out/<mechanism>/ckpt"

# Generation (docs/model.md "Generation"): each run's checkpoint is written at its end (--out); the PaTH model
# answers the reads of fresh flip-flop sequences by generating one token after each read instruction through the KV
# cache (the op's decode), not by the trainer's full forward. 256 sequences: about 5 s on 2 cores.
gen="$build/model/pathattn_generate"
if [[ "$task" == flipflop && -d "$out/path/ckpt" ]]; then
  echo
  if [[ -x "$gen" ]]; then
    echo "== generation: flip-flop reads answered by the PaTH checkpoint through the KV cache =="
    "$gen" --ckpt "$out/path" --eval-reads 256 --threads "$threads" | tee "$out/generate.log"
  else
    echo "run_demo.sh: $gen not built, generation skipped (make -C $build pathattn_generate)"
  fi
fi
