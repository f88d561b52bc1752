// Autoregressive generation with the model's KV cache (prefill, then the cache path: for PaTH on the CPU the op's
// pathattn::decode). Decoder is the one loop body: generate() alternates its sample() and feed(), and
// read_eval.cpp feeds true tokens between sampled ones.
#pragma once

#include <torch/torch.h>

#include <chrono>

#include "sampling.h"
#include "transformer.h"

namespace pathattn::model {

// One batch of sequences being continued: the model, its KV cache and the sampler's generator.
class Decoder {
 public:
  Decoder(Transformer model, const SamplingConfig& s);  // validates s
  // Appends tokens [B, S] int64 (the prefill when nothing is cached yet; later calls append S tokens in one step)
  // and returns the logits after the last of them, [B, V] f32 (f64 for an f64 model). Token ids are checked
  // against the vocabulary (the error names `tokens`, the position and the id).
  torch::Tensor feed(const torch::Tensor& tokens);
  // The logits after each of tokens [B, S] int64, [B, S, V], with the cache left as it was (the model's forward
  // without commit: speculative decoding scores draft tokens this way; the cache must hold a prompt).
  torch::Tensor score(const torch::Tensor& tokens);
  // The next token per sequence [B, 1] for logits [B, V], under the sampling config (sampling.h).
  torch::Tensor sample(const torch::Tensor& logits);
  int64_t cached() const { return cached_; }  // tokens per sequence in the cache

 private:
  Transformer model_;
  SamplingConfig s_;
  at::Generator gen_;
  KVCache cache_;
  void check_tokens(const torch::Tensor& tokens) const;  // the checks feed() and score() share
  int64_t cached_ = 0, batch_ = 0;
};

// Wall times of one generate() call (device-synchronised). Decode covers the n sampled tokens: their sampling and
// the n - 1 feeds after the prefill (the last token is returned, not fed).
struct GenerateStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;  // summed over the batch
  double prefill_s = 0, decode_s = 0;
  double prefill_tok_s() const { return prefill_s > 0 ? prefill_tokens / prefill_s : 0; }
  double decode_tok_s() const { return decode_s > 0 ? decode_tokens / decode_s : 0; }
};

// Waits for t's device (CUDA) so that a wall time covers its work; seconds since t0. For the generation timings.
void sync(const torch::Tensor& t);
double seconds_since(std::chrono::steady_clock::time_point t0);

// Continues prompt [B, T0] int64 (T0 >= 1) by n >= 0 tokens with the KV cache; returns [B, T0 + n]. Greedy at
// temperature 0, else sampled as sampling.h says, with the config's seed.
torch::Tensor generate(Transformer& model, const torch::Tensor& prompt, int64_t n, const SamplingConfig& s = {},
                       GenerateStats* stats = nullptr);

}  // namespace pathattn::model
