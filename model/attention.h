// The attention layer of SPEC 5 for all five mechanisms: q/k/v/o projections without bias, and per mechanism
// the extra parameters: PaTH's w (rank-32 projection, causal depthwise conv 3, SiLU, L2 norm) and beta
// (2 sigmoid, f32), the forget gate (PaTH-FoX, FoX), RoPE (rope). Each call either runs a whole sequence
// (training, prefill) or appends tokens to a KV cache (decoding).
#pragma once

#include <torch/torch.h>

#include "config.h"
#include "path_op.h"

namespace pathattn::model {

// Per-layer decoding state of one batch of sequences.
struct LayerCache {
  torch::Tensor k;     // [B, H, L, D]  PaTH: keys carried to the last position (SPEC 4); rope: rotated keys
  torch::Tensor v;     // [B, H, L, D]
  torch::Tensor G;     // [B, H, L]     cumulative log gate of every cached position (gated mechanisms)
  torch::Tensor conv;  // [B, 2, H*D]   last two inputs of the w convolution (PaTH)
  int64_t pos = 0;     // number of cached positions L
  OpDecodeState op;    // PaTH through the op on CPU f32: the core decode's own cache (then k, v, G are unused)
  bool empty() const { return pos == 0; }
};

// Root-mean-square norm over the last dimension with a learned gain (libtorch 1.13 has none).
class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& cfg);

  // x [B, T, E] -> [B, T, E]. cache == nullptr: one full causal sequence. Otherwise an empty cache is
  // filled by a prefill of x, and a filled one is extended by the T tokens of x one at a time.
  torch::Tensor forward(const torch::Tensor& x, LayerCache* cache = nullptr);

  // The direction, strength and gate this layer computes (exposed for tests). conv_state [B, 2, H*D] or
  // undefined (zeros); the new state is written to *conv_out when given.
  torch::Tensor w_of(const torch::Tensor& x, const torch::Tensor& conv_state, torch::Tensor* conv_out);  // [B,T,H,D]
  torch::Tensor beta_of(const torch::Tensor& x);  // [B, T, H] f32
  torch::Tensor g_of(const torch::Tensor& x);     // [B, T, H] f32, <= 0

 private:
  torch::Tensor full(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& x, LayerCache* cache);
  torch::Tensor decode_one(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& x, LayerCache& cache);
  torch::Tensor rope(const torch::Tensor& x, int64_t pos0) const;  // [B, T, H, D], positions pos0..

  ModelConfig cfg_;
  int64_t H_, D_;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  torch::nn::Linear w_down{nullptr}, w_up{nullptr}, beta_proj{nullptr}, gate_proj{nullptr};
  torch::Tensor conv_w;  // [H*D, 3] depthwise causal conv taps, oldest first
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
};
TORCH_MODULE(Attention);

// Plain softmax attention with libtorch ops. q, k, v [B, H, T, D]; G [B, H, T] or undefined (FoX bias
// G_i - G_j, not scaled). Causal. Uses scaled_dot_product_attention on CUDA where libtorch has it.
torch::Tensor softmax_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& G, double scale);

}  // namespace pathattn::model
