// Tasks (the synthetic ones here; language modelling in task_lm.h): a generator of training batches, fixed
// evaluation sets, and which positions count.
// Every task scores exactly: a position counts when mask is set, and it is wrong when the argmax of the
// logits differs from the target (an error rate, or 1 - accuracy).
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace pathattn::model {

struct Batch {
  torch::Tensor input;   // [B, T] int64
  torch::Tensor target;  // [B, T] int64, the label of each position (the next token; A5: the running product)
  torch::Tensor mask;    // [B, T] bool: positions that are trained on and scored (the deterministic ones)
};

struct EvalSet {
  std::string name;
  Batch data;
};

struct TaskConfig;  // below: which task, with its options (what a checkpoint records)

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab() const = 0;
  virtual int64_t seq_len() const = 0;  // T of a batch
  virtual Batch sample(int64_t batch, std::mt19937_64& rng) const = 0;
  // The evaluation sets of the task, drawn from `seed` (independent of the training stream). The first is
  // the in-distribution set; by default it is the only one, `size` sequences of sample() from seed * 1000003.
  virtual std::vector<EvalSet> eval_sets(int64_t size, uint64_t seed) const {
    std::mt19937_64 rng(seed * 1000003ULL);
    return {{"in_dist", sample(size, rng)}};
  }
  // A language model (every position scored, next-token loss): the trainer also reports perplexity.
  virtual bool language_model() const { return false; }
  // What the training stream reads beyond the generator's seed (the lm task: its shards' fingerprints). A
  // checkpoint records it and a resume on different data is refused. Empty for the synthetic tasks, whose data is
  // a function of the seed and the task's options.
  virtual std::string data_state() const { return ""; }
  // The options this task was made from: make_task(config()) makes the same task (checkpoints record it).
  virtual TaskConfig config() const = 0;
};

// Turns token sequences [B, T+1] into (input, target) and applies a mask over input positions.
Batch make_batch(const std::vector<std::vector<int64_t>>& seqs, const std::vector<std::vector<bool>>& mask);

// ---- flip-flop language modelling (Liu et al. 2023) ----
// Tokens: w=0, r=1, i=2, bit 0 = 3, bit 1 = 4. A sequence is `pairs` instruction-bit pairs; the first
// instruction is w, the last r; the others are i with p_ignore and w or r with (1 - p_ignore) / 2 each.
// The bit after w and i is uniform; the bit after r equals the last written bit. Loss and metric use only
// the bits after r (the only deterministic tokens).
struct FlipFlopConfig {
  int64_t pairs = 256;
  double p_ignore = 0.8;         // training distribution
  std::vector<double> eval_p = {0.8, 0.98, 0.1};  // in-distribution, sparse, dense
  std::vector<std::string> eval_names = {"in_dist", "sparse", "dense"};
};
namespace ff {
constexpr int64_t W = 0, R = 1, I = 2, B0 = 3, B1 = 4;
std::vector<int64_t> sequence(int64_t pairs, double p_ignore, std::mt19937_64& rng);  // 2 * pairs tokens
}
std::unique_ptr<Task> make_flipflop(const FlipFlopConfig& cfg);

// ---- A5 word problems (Merrill et al. 2024) ----
// Tokens are the 60 even permutations of {0..4} (index in lexicographic order of the arrays). Input x_1..x_L
// uniform; the target at position t is the running product x_1 x_2 ... x_t, with (a b)[i] = a[b[i]].
// Every position counts; accuracy at position t is the accuracy for length t.
// bos: a beginning-of-sequence token (60) first, not scored, as Merrill et al.'s tokenizer puts one. Without it no
// model whose positions enter only the attention logits (PaTH, RoPE, FoX, none) can answer x_2 = x_1: position 2 then
// sees the same values as position 1 (every attention output is a mean of equal rows), so it must give the same
// answer, x_1, where x_1 x_1 is asked (1 sequence in 60; docs/results/synthetic/README.md). Off by default so that the
// grid's finished cells stay reproducible.
struct A5Config {
  int64_t length = 16;
  bool bos = false;
};
namespace a5 {
const std::vector<std::array<int, 5>>& elements();  // 60 permutations
int mul(int a, int b);                               // index of a b
}
std::unique_ptr<Task> make_a5(const A5Config& cfg);

// ---- MQRAR-N: multi-query repeated associative recall, N-back ----
// Tokens: keys 0..K-1, values K..K+V-1, query markers K+V..2K+V-1 (one per key). A sequence is length/2
// pairs. A pair is either an assignment (key k, value v: k now also has value v, the newest of its history)
// or, with probability p_query once some key has been assigned at least N times, a query (marker of a
// key k drawn among those with at least N assignments, then the N-th most recent value assigned to k).
// Loss and metric use only the answers (the value after a query marker).
struct MqrarConfig {
  int64_t n_back = 1;
  int64_t length = 768;
  int64_t keys = 32;
  int64_t values = 32;
  double p_query = 0.25;
};
namespace mqrar {
// Tokens and, per position, whether it is an answer (its previous token a query marker).
std::vector<int64_t> sequence(const MqrarConfig& cfg, std::mt19937_64& rng);
}
std::unique_ptr<Task> make_mqrar(const MqrarConfig& cfg);

// ---- language modelling on pre-tokenised shards: task_lm.h ----
struct LmConfig {
  std::string data_dir;      // folder of train-*.tok, valid-*.tok, test-*.tok (tools/lm_data.py)
  int64_t seq_len = 1024;    // T
  int64_t train_shards = 0;  // > 0: only the first n train shards (pins a run to that data); 0: all present
};

// A task by its CLI name (flipflop, a5, mqrar, lm) and the options of each; only those of the named task are used.
// A checkpoint's config.txt records it (config_io.h), so that make_task rebuilds the task of a trained model.
struct TaskConfig {
  std::string name = "flipflop";
  FlipFlopConfig flipflop;
  A5Config a5;
  MqrarConfig mqrar;
  LmConfig lm;
};
std::unique_ptr<Task> make_task(const TaskConfig& cfg);

}  // namespace pathattn::model
