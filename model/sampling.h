// How generation picks the next token from the logits: greedy, or sampling at a temperature after the top-k and
// top-p (nucleus) filters. The filters are plain functions of the logits so that tests can check them by hand.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace pathattn::model {

struct SamplingConfig {
  double temperature = 0.0;  // 0: greedy (argmax; the filters then change nothing); > 0: softmax(logits / it)
  int64_t top_k = 0;         // > 0: sample among the k most likely tokens only; 0: off
  double top_p = 1.0;        // in (0, 1]: sample within the smallest most-likely set of probability >= top_p; 1: off
  uint64_t seed = 0;         // of the sampler's generator
  // Throws std::invalid_argument naming the field (temperature, top_k, top_p) and what it expected.
  void validate() const;
};

// logits [..., V] with every entry below the k-th largest of its row set to -inf. Entries equal to the k-th largest
// are all kept, so the result does not depend on how a sort orders ties (more than k may survive). k == 0 or
// k >= V: unchanged.
torch::Tensor top_k_filter(const torch::Tensor& logits, int64_t k);

// logits [..., V] with every token outside the row's nucleus set to -inf. The nucleus: sort the probabilities
// softmax(logits) in decreasing order and keep each token whose predecessors' total is < p (so the kept set is
// the smallest prefix whose probability reaches p, and the most likely token is always kept); tokens as likely as
// the last kept one are kept too (ties, as in top_k_filter). p == 1: unchanged (a rounded cumulative sum could
// otherwise reach 1 before the tail and drop it).
torch::Tensor top_p_filter(const torch::Tensor& logits, double p);

// The next token [B, 1] int64 for logits [B, V]: argmax when temperature == 0, else a draw from
// softmax(top_p_filter(top_k_filter(logits / temperature))) with gen (a CPU generator; the draw runs on the CPU
// and the token is returned on the logits' device).
torch::Tensor sample_next(const torch::Tensor& logits, const SamplingConfig& s, at::Generator& gen);

}  // namespace pathattn::model
