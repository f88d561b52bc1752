// Decoder-only transformer: token embedding, pre-RMSNorm blocks (attention + SwiGLU MLP), final norm,
// untied head. The position mechanism (config.h) is the only thing that differs between runs.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "attention.h"
#include "config.h"

namespace pathattn::model {

class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t d_model, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Linear gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(SwiGLU);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x, LayerCache* cache = nullptr, bool commit = true);
  AttentionImpl& attention() { return *attn; }
  const AttentionImpl& attention() const { return *attn; }

 private:
  RMSNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  SwiGLU mlp{nullptr};
};
TORCH_MODULE(Block);

using KVCache = std::vector<LayerCache>;

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelConfig& cfg);

  // tokens [B, T] int64 -> logits [B, T, V] (f32). With a cache: an empty one is filled (prefill), a
  // filled one is extended by the T tokens (decode); logits are for the given tokens either way. commit = false on
  // a filled cache (speculative decoding: score draft tokens, then feed the accepted ones): the same logits, every
  // layer's cache left as it was.
  torch::Tensor forward(const torch::Tensor& tokens, KVCache* cache = nullptr, bool commit = true);

  const ModelConfig& config() const { return cfg_; }
  int64_t num_parameters() const;
  // Every layer's PathRunOptions (attention.h; train() sets deterministic_backward from TrainConfig::deterministic).
  void set_path_run_options(const PathRunOptions& o);
  PathRunOptions path_run_options() const;

 private:
  ModelConfig cfg_;
  torch::nn::Embedding embed{nullptr};
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Transformer);

// Generation with the KV cache: generate.h.

}  // namespace pathattn::model
