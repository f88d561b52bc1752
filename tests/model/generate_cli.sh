#!/usr/bin/env bash
# pathattn_generate end to end (ctest ModelGenerate.Cli): trains a tiny flip-flop checkpoint for 3 steps, runs every
# prompt source and --eval-reads on it, and checks that each bad argument fails (non-zero exit) with an error that
# names it. Errors the library raises whatever the caller (top_p > 1, a directory without config.txt) are tested in
# test_model_generate.cpp. Each case is a process start (about 0.5 s of loading libtorch), so the cases run
# concurrently and are checked after they all end.   generate_cli.sh PATHATTN_TRAIN PATHATTN_GENERATE
set -uo pipefail
train="$1"
gen="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

"$train" --task flipflop --ff-pairs 12 --mechanism path --layers 1 --width 16 --heads 2 --steps 3 --batch 2 \
  --warmup 1 --eval-every 0 --eval-size 2 --log-every 0 --threads 1 --out "$dir/run" >"$dir/train.log" 2>&1 ||
  { cat "$dir/train.log"; echo "FAIL: training the checkpoint"; exit 1; }
ck="$dir/run"
printf '0 3 1\n\n0 4 2 3 1\n0 4 1\n' >"$dir/prompts.txt"

# case KIND NAME REGEX ARGS...: runs pathattn_generate ARGS in the background. KIND ok: it must succeed and print
# REGEX (grep -E); bad: it must exit non-zero and print REGEX.
names=()
declare -A kind regex
case_() {
  kind[$2]="$1"
  regex[$2]="$3"
  names+=("$2")
  local name="$2"
  shift 3
  ("$gen" --threads 1 "$@" >"$dir/$name.out" 2>&1; echo $? >"$dir/$name.rc") &
}

case_ ok prompt "^\[0\] generated:( [0-4]){5}$" --ckpt "$ck/ckpt" --prompt "0,3 2 4 1" --tokens 5
case_ ok prompt-file "rates \(2 batches, after 0 untimed warm-up runs each\)" --ckpt "$ck" --prompt-file "$dir/prompts.txt" \
  --warmup 0 --tokens 2 --temperature 1 --top-k 3 --top-p 0.9
case_ ok sample "first generated token is the task's answer: [0-9]+ / 3" --ckpt "$ck" --task flipflop --sample 3 --tokens 2
case_ ok speculative "speculative \(prompt lookup, 4 tokens per draft, 2-gram\): [0-9]+ calls after the prefills for 24 tokens" \
  --ckpt "$ck" --prompt-file "$dir/prompts.txt" --tokens 8 --speculative 4 --warmup 0
case_ ok eval-reads "read accuracy [0-9.]+% \([0-9]+ / [0-9]+ correct" --ckpt "$ck" --eval-reads 2 --p-ignore 0.5

case_ bad top-p-zero "top_p: expected a value in \(0, 1\]" --ckpt "$ck" --prompt 0 --top-p 0
case_ bad top-k-negative "top_k: expected >= 0" --ckpt "$ck" --prompt 0 --top-k -1
case_ bad temperature-negative "temperature: expected a finite value >= 0" --ckpt "$ck" --prompt 0 --temperature -1
case_ bad missing-checkpoint "checkpoint: '$dir/nope' is not a directory" --ckpt "$dir/nope" --prompt 0
case_ bad token-outside-vocab "--prompt: token id 5 at position 1 is outside the vocabulary \[0, 5\)" --ckpt "$ck" --prompt "0 5"
case_ bad token-not-a-number "--prompt-file .*line 3: 'x' is not a token id" --ckpt "$ck" --prompt-file <(printf '0 1\n\n0 x\n')
case_ bad no-prompt "expected one of --prompt, --prompt-file, --sample N, --eval-reads N" --ckpt "$ck"
case_ bad speculative-sampled "--speculative: greedy only \(--temperature 0\)" --ckpt "$ck" --prompt 0 --speculative 2 \
  --temperature 1
case_ bad speculative-draft "--speculative / --ngram: draft: expected 1..63 tokens" --ckpt "$ck" --prompt 0 --speculative 64
case_ bad wrong-task "--task mqrar: the checkpoint was trained on flipflop" --ckpt "$ck" --task mqrar --sample 1
wait

failures=0
for name in "${names[@]}"; do
  rc="$(cat "$dir/$name.rc" 2>/dev/null || echo missing)"
  if [[ "${kind[$name]}" == ok && "$rc" != 0 ]]; then
    echo "FAIL $name: exit code $rc (expected success)"
  elif [[ "${kind[$name]}" == bad && "$rc" == 0 ]]; then
    echo "FAIL $name: succeeded (expected an error)"
  elif ! grep -Eq -- "${regex[$name]}" "$dir/$name.out"; then
    echo "FAIL $name: output lacks /${regex[$name]}/"
  else
    if [[ "${kind[$name]}" == bad ]]; then echo "ok   $name: $(grep -E -- "${regex[$name]}" "$dir/$name.out" | head -1)"
    else echo "ok   $name"; fi
    continue
  fi
  cat "$dir/$name.out"
  failures=$((failures + 1))
done
if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"
