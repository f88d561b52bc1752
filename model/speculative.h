// Greedy generation with prompt-lookup drafts: speculative decoding without a draft model. The next few tokens are
// guessed from the sequence itself (what followed the last n-gram where it occurred before), scored in one call
// without commit (Transformer::forward(..., commit = false): a PaTH cache cannot be rolled back), and the longest
// prefix that greedy decoding would have produced is fed; the model's own next token follows. The output is greedy
// generate()'s (to the rounding of the logits: a near-tie can break the other way when the same tokens reach the
// cache in a different number of calls); repeated text takes fewer calls.
#pragma once

#include <torch/torch.h>

#include "generate.h"

namespace pathattn::model {

struct SpeculativeConfig {
  int64_t draft = 8;  // tokens guessed per step, 1..63 (a call without commit takes <= 64 tokens on CUDA)
  int64_t ngram = 2;  // length of the context suffix looked up, >= 1
  void validate() const;
};

struct SpeculativeStats {
  int64_t steps = 0;     // calls after the prefill: each feeds 1 + accepted tokens
  int64_t drafted = 0;   // tokens guessed and scored
  int64_t accepted = 0;  // of them, the ones greedy decoding would have produced
};

// Continues prompt [1, T0] int64 (one sequence: the cache holds one length per batch) by n >= 0 greedy tokens;
// returns [1, T0 + n]. stats and spec (optional) get the wall times and the draft counts.
torch::Tensor generate_speculative(Transformer& model, const torch::Tensor& prompt, int64_t n,
                                   const SpeculativeConfig& c = {}, GenerateStats* stats = nullptr,
                                   SpeculativeStats* spec = nullptr);

}  // namespace pathattn::model
