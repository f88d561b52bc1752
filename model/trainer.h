// Training loop: AdamW, linear warm-up then cosine decay, gradient clipping and accumulation, periodic evaluation on
// the task's fixed sets, resumable checkpoints (checkpoint.h), a progress line, metrics as CSV and JSON.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "optim_step.h"
#include "precision.h"
#include "task.h"
#include "transformer.h"

namespace pathattn::model {

struct TrainConfig {
  int64_t steps = 1000;
  int64_t batch = 16;
  int64_t warmup = 100;
  double lr = 1e-3;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.98;
  double clip = 1.0;
  uint64_t seed = 1;
  int64_t eval_every = 200;   // also evaluates at the last step
  int64_t eval_size = 256;    // sequences per evaluation set
  int64_t eval_batch = 64;
  int64_t log_every = 20;
  int64_t ckpt_every = 0;     // 0: only at the end (when out_dir is set)
  double stop_error = -1;     // >= 0: stop once the in-distribution error is <= this (after an evaluation)
  // >= 0: stop once the in-distribution sequence error (EvalResult::seq_error) is <= this (after an evaluation).
  // Synthetic tasks only (a language model's windows are never all right).
  double stop_seq_error = -1;
  std::string out_dir;        // metrics.csv, metrics.json, ckpt/ (empty: nothing written)
  bool resume = false;
  // Micro-batches of `batch` sequences per optimizer step (gradient accumulation): a step sees batch * grad_accum
  // sequences, with the memory of `batch`. The step's loss is the mean of the micro-batches' losses.
  int64_t grad_accum = 1;
  // Chunking a long run into bounded commands (a device command has 10 minutes): this invocation stops, with a
  // checkpoint, after `stop_after` steps (> 0) or at the first step that ends past `time_limit_s` seconds (> 0);
  // the next invocation with resume continues where it stopped, on the same loss curve.
  int64_t stop_after = 0;
  double time_limit_s = 0;
  // A checkpoint folder to take the initial weights from, by name (checkpoint.h init_from_checkpoint: e.g. PaTH
  // from a trained RoPE model). Used only when the run does not resume from its own checkpoint.
  std::string init_from;
  torch::Device device = torch::kCPU;
  Precision precision = Precision::f32;  // bf16: autocast over the f32 parameters (precision.h)
  // PaTH's CUDA backward: the fixed summation order (the same gradient bits on every run) or, false, the faster
  // atomic order (docs/cuda.md; the flag does not change the CPU backward). Applied to the model by train()
  // (PathRunOptions::deterministic_backward).
  bool deterministic = true;
  // The rest of a CUDA step deterministic too, for runs that must repeat bit for bit (with `deterministic`: the same
  // seed, GPU and software give the same weights): while train() runs, torch's deterministic algorithms
  // (warn-only: an op without a deterministic kernel warns and runs; the boolean-mask loss's backward and the
  // embedding's take their sorted, atomic-free paths) and cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8
  // unless already set; it must precede the process's first cuBLAS call). Off by default: slower, and process-wide.
  bool torch_deterministic = false;
  // The optimizer step on ATen's foreach kernels (optim_step.h: the same update, a few kernels per step instead of
  // ~11 per parameter tensor); false: torch::optim::AdamW::step and a clipping kernel per tensor, for comparison.
  bool foreach_step = true;
};

// TrainConfig::torch_deterministic while alive (train() holds one; bench_step's :repro rows too): torch's
// deterministic algorithms on (warn-only), CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set; torch's switch is restored on
// exit (a process may run other work after).
class TorchDeterminismGuard {
 public:
  explicit TorchDeterminismGuard(bool on);
  ~TorchDeterminismGuard();
  TorchDeterminismGuard(const TorchDeterminismGuard&) = delete;
  TorchDeterminismGuard& operator=(const TorchDeterminismGuard&) = delete;

 private:
  bool on_, prev_ = false, prev_warn_only_ = false;
};

struct EvalResult {
  std::map<std::string, double> error;  // per set: fraction of scored positions predicted wrong
  std::map<std::string, double> loss;   // per set: mean cross entropy over scored positions
  // Per set: fraction of sequences (with at least one scored position) that have a scored position predicted wrong.
  // A5: 1 - the fraction of sequences whose every prefix product is right, the accuracy of Merrill et al.'s
  // word-problem experiments (their released code's validation metric, jopetty/word-problem).
  std::map<std::string, double> seq_error;
  std::vector<double> pos_accuracy;     // of the first set: accuracy at each position (A5: per length)
  // Of the first set: at each position t, the fraction of sequences whose scored positions 0..t are all right
  // (A5: the sequence accuracy of length t + 1, read off the same model).
  std::vector<double> prefix_seq_accuracy;
};

// What one evaluation batch contributes (score_batch), summed by evaluate(). Positions outside the mask count
// nowhere; a sequence with no scored position is not counted as a sequence.
struct ScoreCounts {
  int64_t scored = 0, wrong = 0;         // scored positions, and those whose argmax differs from the target
  int64_t sequences = 0, seq_wrong = 0;  // sequences with a scored position, and those with a wrong one
  std::vector<int64_t> pos_scored, pos_right;  // [T]: per position
  std::vector<int64_t> prefix_right;           // [T]: sequences whose scored positions 0..t are all right
};
// logits [B, T, V] against b.target under b.mask (on any device; the counts come back to the host).
ScoreCounts score_batch(const torch::Tensor& logits, const Batch& b);

struct TrainResult {
  int64_t steps_done = 0;
  bool stopped_early = false;  // stop_after, time_limit_s, stop_error or stop_seq_error ended it before cfg.steps
  // Why this invocation ended: "steps" (cfg.steps done), "stop_error" / "stop_seq_error" (the run is finished: its
  // criterion was met), "stop_after" / "time_limit" (unfinished: resume to continue).
  std::string stop_reason = "steps";
  int64_t tokens_per_step = 0;
  double seconds = 0;
  double final_train_loss = 0;
  EvalResult final_eval;
};

double lr_at(const TrainConfig& cfg, int64_t step);  // step 0-based

// Cross entropy over the masked positions.
torch::Tensor masked_loss(const torch::Tensor& logits, const Batch& b);

EvalResult evaluate(Transformer& model, const std::vector<EvalSet>& sets, int64_t eval_batch, torch::Device dev,
                    Precision precision = Precision::f32);

// AdamW as the trainer configures it (betas, weight decay; the learning rate is set per step by train()).
torch::optim::AdamWOptions adamw_options(const TrainConfig& cfg);

// One optimisation step on a batch already on the model's device: zero the gradients, forward and masked loss
// under cfg.precision, backward, gradient clipping (cfg.clip), AdamW. train() runs this; so does bench_step.
// Returns the loss as a device scalar (reading it synchronises with the device).
torch::Tensor train_step(Transformer& model, torch::optim::AdamW& opt, const Batch& b, const TrainConfig& cfg);
// The same over micro-batches (gradient accumulation): each one's loss / n is backpropagated in turn (so one
// micro-batch's activations are alive at a time), then one clip and one AdamW step. Returns the mean loss.
torch::Tensor train_step(Transformer& model, torch::optim::AdamW& opt, const std::vector<Batch>& micro,
                         const TrainConfig& cfg);

// Micro-batch m of optimizer step s (0-based) of the training stream: drawn from a generator seeded by
// (cfg.seed, s * cfg.grad_accum + m), so the data order is a function of the seed (the same for every mechanism
// and after a resume). With grad_accum = 1 this is the stream the trainer always drew.
Batch draw_batch(const Task& task, const TrainConfig& cfg, int64_t step, int64_t micro = 0);

TrainResult train(Transformer& model, const Task& task, const TrainConfig& cfg, const std::string& run_label = "");

}  // namespace pathattn::model
