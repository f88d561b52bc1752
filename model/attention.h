// The attention layer of docs/spec.md §5 for all five mechanisms. Its PaTH form is the same layer as Python's
// pathattn.PaTHAttention (python/pathattn/layer.py) and fla's PaTHAttention: the same parameter names (a state_dict
// key here is the key there, e.g. q_proj.weight, w_proj.0.weight, w_conv1d.weight, bt_proj.bias, g_proj.weight,
// maybe_q_norm.weight), the same initialisation (weights N(0, 0.02), biases 0), GQA (n_kv_head), the same options
// (low_rank_w, w_shortconv, conv_size, qk_norm, gate_scale, beta_max). tests/python/test_cross_language.py loads one
// set of weights into both and compares outputs. PaTH attention itself is the torch op (path_op.h).
// Each call either runs a whole sequence (training, prefill) or appends tokens to a KV cache (decoding).
#pragma once

#include <torch/torch.h>

#include <utility>

#include "config.h"
#include "path_op.h"

namespace pathattn::model {

// How a PaTH layer runs, beyond what the model is: a property of the run (not in ModelConfig, not saved).
struct PathRunOptions {
  // PaTH's backward on CUDA in the op's fixed summation order (true, the default: the same gradient bits on every
  // run) or its faster atomic order (false; TrainConfig::deterministic).
  bool deterministic_backward = true;
  // Timing only (bench_step's path:sdpa rows): the op replaced by causal softmax attention on the same q, k, v (SDPA
  // on CUDA; no gate bias), w, beta and g kept in the graph by a zero-weighted term so that their forward and
  // backward still run. A step then costs all the PaTH layer does but the op: set beside the real rows, it splits
  // PaTH's step time into the op and the rest. Wrong outputs by design: never for training.
  bool sdpa_for_timing = false;
  // RoPE's rotation on CUDA through the fused op (pathattn::rope_rotate: one pass each way instead of ~20, the same
  // bits as the composed form by construction, checked on the GPU by RopeRotateCuda.FusedEqualsTheComposedFormBitForBit;
  // 24 ms off the 98M model's 122 ms step on an H100, docs/perf/results.md "twenty-eighth session"). false: the
  // composed ATen form (bench_step's rope:composed rows).
  bool fused_rope = true;
};

// Per-layer decoding state of one batch of sequences.
struct LayerCache {
  int64_t pos = 0;  // number of cached positions L
  // PaTH, decoding through the op (CPU f32 / bf16, and CUDA): the op's key cache (docs/spec.md §4) on the model's
  // device and the last conv_size - 1 inputs of the w short convolution [B, conv_size - 1, H*D].
  pathattn::DecodeState path;
  torch::Tensor conv;
  // PaTH where the op has no decode (a float64 model on the CPU, the tests' reference precision): the layer's inputs
  // so far [B, L, E]; each call re-runs the whole sequence through the op's forward.
  torch::Tensor x;
  // The softmax mechanisms: keys (rotated for rope) and values per kv head [B, H, L, D], and the cumulative log
  // gate per query head [B, HQ, L] (fox).
  torch::Tensor k, v, G;
  bool empty() const { return pos == 0; }
};

// Root-mean-square norm over the last dimension with a learned gain `weight` (libtorch 1.13 has none; on CUDA with
// libtorch >= 2.4 torch's rms_norm for f32 inputs, attention.cpp).
class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// RoPE's rotation composed of ATen operators, x [B, T, heads, D] by the angle tables cos, sin [T, D / 2] (f32; f64
// for f64 x): [x1 cos - x2 sin, x1 sin + x2 cos] in f32 (f64), rounded back to x's dtype. The form every recorded
// RoPE run used; pathattn::rope_rotate (PathRunOptions::fused_rope) gives the same bits in one pass.
torch::Tensor rope_rotate_composed(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// The angle tables of x [B, T, heads, D] at positions pos0.. (cos, sin [T, D / 2] in f32, f64 for f64 x, on x's
// device): angle(t, j) = t * base^(-j / (D / 2)).
std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& x, int64_t pos0, double base);

// fla's ShortConvolution as the PaTH layer uses it: causal depthwise conv over time with SiLU, no bias; `weight`
// [C, 1, K] as torch's Conv1d (tap K - 1 multiplies x_t, tap K - 1 - s multiplies x_{t-s}).
class ShortConvolutionImpl : public torch::nn::Module {
 public:
  ShortConvolutionImpl(int64_t channels, int64_t kernel_size);
  // x [B, T, C] continuing after the K - 1 inputs `state` [B, K - 1, C] (undefined: zeros, a sequence start);
  // the last K - 1 inputs are written to *state_out when given.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& state = {}, torch::Tensor* state_out = nullptr);
  // The layer's unit directions [B, T, C / head_dim, head_dim] (f32; f64 for f64 x): forward() followed by the L2
  // norm over each head's channels, fused in one op each way (pathattn::short_conv_w, docs/math.md Eq. 44-46), with
  // the same state arguments. forward() stays as the composition it replaces (the tests compare the two).
  torch::Tensor directions(const torch::Tensor& x, int64_t head_dim, const torch::Tensor& state = {},
                           torch::Tensor* state_out = nullptr);
  torch::Tensor weight;
};
TORCH_MODULE(ShortConvolution);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& cfg);

  // x [B, T, E] -> [B, T, E]. cache == nullptr: one full causal sequence. Otherwise an empty cache is filled by a
  // prefill of x, and a filled one is extended by the T tokens of x (one call of the op's decode for PaTH). commit =
  // false on a filled cache (speculative decoding's verification): the same outputs, the cache left as it was (for
  // PaTH the op's decode without commit; a PaTH cache cannot be rolled back); on an empty one it is an error.
  torch::Tensor forward(const torch::Tensor& x, LayerCache* cache = nullptr, bool commit = true);

  // The direction, strength and gate this layer computes (exposed for tests). conv_state [B, K - 1, H*D] or
  // undefined (zeros); the new state is written to *conv_out when given.
  torch::Tensor w_of(const torch::Tensor& x, const torch::Tensor& conv_state, torch::Tensor* conv_out);  // [B,T,H,D]
  torch::Tensor beta_of(const torch::Tensor& x);  // [B, T, H] f32
  torch::Tensor g_of(const torch::Tensor& x);     // [B, T, HQ] f32, <= 0; times D^-1/2 under gate_scale fla

  void set_path_run_options(const PathRunOptions& o) { run_ = o; }
  const PathRunOptions& path_run_options() const { return run_; }

 private:
  torch::Tensor path(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& x,
                     LayerCache* cache, bool commit);
  torch::Tensor softmax_full(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& x, LayerCache* cache);
  torch::Tensor softmax_decode(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& x, LayerCache& cache, bool commit);
  torch::Tensor rope(const torch::Tensor& x, int64_t pos0) const;  // [B, T, heads, D], positions pos0..

  ModelConfig cfg_;
  int64_t HQ_, H_, D_;
  PathRunOptions run_;
  // fla's names (python/pathattn/layer.py); w_proj is a Sequential (low rank: w_proj.0, w_proj.1) or one Linear.
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  torch::nn::Sequential w_proj{nullptr};
  torch::nn::Linear w_proj_full{nullptr};
  ShortConvolution w_conv1d{nullptr};
  torch::nn::Linear bt_proj{nullptr}, g_proj{nullptr};
  RMSNorm maybe_q_norm{nullptr}, maybe_k_norm{nullptr};
};
TORCH_MODULE(Attention);

// Plain softmax attention with libtorch ops for the baselines (rope, fox, nope; never PaTH). q [B, HQ, T, D],
// k, v [B, H, S, D] (HQ a multiple of H); G [B, HQ, S] or undefined (FoX bias G_i - G_j, as given). Causal, the T
// queries being the last T of the S positions. Uses scaled_dot_product_attention on CUDA where libtorch has it.
torch::Tensor softmax_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& G, double scale);

}  // namespace pathattn::model
