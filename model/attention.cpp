#include "attention.h"

#include <torch/version.h>

#include "pathattn_torch.h"

#include <cmath>

namespace pathattn::model {

namespace {
// f32 for every low-precision or f32 tensor (docs/spec.md §6: beta, w, g, softmax in f32), f64 kept for f64 tests.
torch::ScalarType acc(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}
// [B, H, S, D] -> [B, H * rep, S, D]: kv head h serves query heads h * rep .. h * rep + rep - 1 (GQA, as the op).
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t rep) { return rep == 1 ? x : x.repeat_interleave(rep, 1); }
}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // torch's rms_norm on CUDA for an f32 x (the residual stream, which every block and the final norm read): one
  // fused kernel each way where torch has it (_fused_rms_norm), against ~6 forward and ~10 backward kernels of the
  // composed form below, each a pass over x: a launch-bound small model (the synthetic tasks) and a memory-bound
  // large one both pay for those. The same formula. Autocast excluded around it, so that it stays f32 whatever
  // autocast's policy for rms_norm is (the composed form is f32 too). Other dtypes (the q / k norms see bf16 under
  // autocast), the CPU and older libtorch keep the composed form; so do runs under torch's deterministic algorithms
  // (the trainer's --torch-deterministic), whose composed reductions are known to repeat bit for bit.
  if (x.is_cuda() && x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
      !at::globalContext().deterministicAlgorithms()) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t last = x.size(-1);
    return at::rms_norm(x, at::IntArrayRef(&last, 1), weight, eps_);
  }
#endif
  auto xf = x.to(acc(x));
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps_);
  return (y * weight).to(x.scalar_type());
}

ShortConvolutionImpl::ShortConvolutionImpl(int64_t channels, int64_t kernel_size) {
  weight = register_parameter("weight", torch::empty({channels, 1, kernel_size}).normal_(0.0, 0.02));  // as fla
}

torch::Tensor ShortConvolutionImpl::forward(const torch::Tensor& x, const torch::Tensor& state,
                                           torch::Tensor* state_out) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), K = weight.size(2);
  auto prev = state.defined() ? state.to(x.scalar_type()) : torch::zeros({B, K - 1, C}, x.options());
  auto xp = torch::cat({prev, x}, 1);  // [B, K - 1 + T, C]
  auto w = weight.select(1, 0);        // [C, K]
  auto y = xp.narrow(1, 0, T) * w.select(1, 0);
  for (int64_t j = 1; j < K; ++j) y = y + xp.narrow(1, j, T) * w.select(1, j);
  if (state_out) *state_out = xp.narrow(1, T, K - 1).detach();
  return torch::silu(y);
}

torch::Tensor ShortConvolutionImpl::directions(const torch::Tensor& x, int64_t head_dim, const torch::Tensor& state,
                                               torch::Tensor* state_out) {
  const int64_t K = weight.size(2);
  if (state_out) {  // the last K - 1 inputs of [state; x] (zeros before a short first call)
    auto prev = state.defined() ? state.to(x.scalar_type()) : torch::zeros({x.size(0), K - 1, x.size(2)}, x.options());
    *state_out = torch::cat({prev, x}, 1).narrow(1, x.size(1), K - 1).detach();
  }
  std::optional<torch::Tensor> st;
  if (state.defined()) st = state.to(x.scalar_type());
  return pathattn::short_conv_w(x, weight, st, std::nullopt, head_dim);
}

torch::Tensor softmax_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& G, double scale) {
  const int64_t rep = q.size(1) / k.size(1);
  if (rep != 1) return softmax_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), G, scale);
  // rope and nope on CUDA: SDPA (FlashAttention for bf16/f16 at D <= 256, else memory-efficient or math), never a
  // [T, S] logit matrix. SDPA's is_causal aligns the mask top-left, so only square (training, prefill) calls take
  // it. FoX keeps the composed path below: its bias G_i - G_j would be a dense [B, H, T, S] mask, which rules
  // FlashAttention out. The CPU keeps the composed path on every libtorch (its numbers are the recorded ones).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (q.is_cuda() && !G.defined() && q.size(2) == k.size(2)) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale);
  }
#elif TORCH_VERSION_MAJOR == 2
  // torch 2.0's SDPA has no scale argument; its default is D^-1/2, the only scale the model uses.
  if (q.is_cuda() && !G.defined() && q.size(2) == k.size(2) &&
      std::abs(scale * std::sqrt(static_cast<double>(q.size(-1))) - 1.0) < 1e-12) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  }
#endif
  const int64_t T = q.size(2), S = k.size(2);
  auto logits = q.matmul(k.transpose(-1, -2)).to(acc(q)) * scale;  // [B, H, T, S]
  if (G.defined()) logits = logits + (G.narrow(2, S - T, T).unsqueeze(-1) - G.unsqueeze(-2));
  // Query i (0-based among the last T of S positions) sees keys up to S - T + i.
  auto mask = torch::ones({T, S}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(S - T + 1);
  logits = logits.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return torch::softmax(logits, -1).to(v.scalar_type()).matmul(v);  // [B, H, T, D]
}

AttentionImpl::AttentionImpl(const ModelConfig& cfg)
    : cfg_(cfg), HQ_(cfg.n_head), H_(cfg.kv_heads()), D_(cfg.head_dim()) {
  const int64_t E = cfg.d_model, HQD = HQ_ * D_, HD = H_ * D_;
  auto init = [](torch::nn::Linear& l) {
    torch::nn::init::normal_(l->weight, 0.0, 0.02);  // docs/spec.md §5 / fla: N(0, 0.02), biases 0
    if (l->bias.defined()) torch::nn::init::zeros_(l->bias);
    return l;
  };
  auto linear = [&](int64_t in, int64_t out, bool bias) {
    torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
    return init(l);
  };
  q_proj = register_module("q_proj", linear(E, HQD, false));
  k_proj = register_module("k_proj", linear(E, HD, false));
  v_proj = register_module("v_proj", linear(E, HD, false));
  if (uses_path(cfg.mechanism)) {
    if (cfg.low_rank_w) {
      w_proj = register_module("w_proj", torch::nn::Sequential(linear(E, cfg.w_rank, false), linear(cfg.w_rank, HD, false)));
    } else {
      w_proj_full = register_module("w_proj", linear(E, HD, false));
    }
  }
  if (cfg.qk_norm) {  // fla's names; RMSNorm's eps as fla's (1e-5)
    maybe_q_norm = register_module("maybe_q_norm", RMSNorm(D_, 1e-5));
    maybe_k_norm = register_module("maybe_k_norm", RMSNorm(D_, 1e-5));
  }
  if (uses_path(cfg.mechanism)) {
    if (cfg.w_shortconv) w_conv1d = register_module("w_conv1d", ShortConvolution(HD, cfg.conv_size));
    bt_proj = register_module("bt_proj", linear(E, H_, true));  // bias 0: beta starts at 1
  }
  if (uses_gate(cfg.mechanism)) g_proj = register_module("g_proj", linear(E, HQ_, true));
  o_proj = register_module("o_proj", linear(HQD, E, false));
}

torch::Tensor AttentionImpl::w_of(const torch::Tensor& x, const torch::Tensor& conv_state, torch::Tensor* conv_out) {
  const int64_t B = x.size(0), T = x.size(1);
  auto u = cfg_.low_rank_w ? w_proj->forward(x) : w_proj_full(x);  // [B, T, H*D]
  if (cfg_.w_shortconv) return w_conv1d->directions(u, D_, conv_state, conv_out);  // conv, SiLU and norm fused
  auto w = u.view({B, T, H_, D_}).to(acc(u));
  // F.normalize's rule, as the Python layer: w / max(|w|, 1e-12).
  return torch::nn::functional::normalize(w, torch::nn::functional::NormalizeFuncOptions().p(2).dim(-1).eps(1e-12));
}

torch::Tensor AttentionImpl::beta_of(const torch::Tensor& x) {
  auto beta = 2.0 * torch::sigmoid(bt_proj(x).to(acc(x)));  // [B, T, H]
  if (cfg_.beta_max > 0) beta = beta.clamp(0.0, cfg_.beta_max);
  return beta;
}

torch::Tensor AttentionImpl::g_of(const torch::Tensor& x) {
  auto g = torch::log_sigmoid(g_proj(x).to(acc(x)));  // [B, T, HQ]
  // fla: the gate enters as scale (s + G_i - G_j): scaling g scales its cumulative sums G.
  if (cfg_.gate_scale == GateScale::fla) g = g * (1.0 / std::sqrt(static_cast<double>(D_)));
  return g;
}

torch::Tensor rope_rotate_composed(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t T = x.size(1), half = x.size(-1) / 2;
  auto c = cos.view({1, T, 1, half}), s = sin.view({1, T, 1, half});
  auto x1 = x.narrow(-1, 0, half).to(acc(x)), x2 = x.narrow(-1, half, half).to(acc(x));
  return torch::cat({x1 * c - x2 * s, x1 * s + x2 * c}, -1).to(x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& x, int64_t pos0, double base) {
  const int64_t T = x.size(1), half = x.size(-1) / 2;
  auto fopts = torch::TensorOptions().dtype(acc(x)).device(x.device());
  auto inv = torch::pow(base, -torch::arange(half, fopts) / static_cast<double>(half));  // [D/2]
  auto ang = torch::arange(pos0, pos0 + T, fopts).unsqueeze(1) * inv.unsqueeze(0);    // [T, D/2]
  return {ang.cos(), ang.sin()};
}

torch::Tensor AttentionImpl::rope(const torch::Tensor& x, int64_t pos0) const {
  const auto [cos, sin] = rope_tables(x, pos0, cfg_.rope_base);
  if (run_.fused_rope && x.is_cuda() && x.scalar_type() != torch::kDouble)  // the same tables, the same bits
    return pathattn::rope_rotate(x, cos, sin);
  return rope_rotate_composed(x, cos, sin);
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, LayerCache* cache, bool commit) {
  if (!commit && (cache == nullptr || cache->empty()))
    throw std::invalid_argument("commit = false needs a cache that holds a prompt (the prefill commits)");
  if (cache && !cache->empty() && uses_path(cfg_.mechanism) && cache->x.defined()) {
    // PaTH decoding where the op has no decode (a float64 model on the CPU: the CPU decode is float32, and the tests'
    // f64 comparisons want f64 throughout): the whole sequence again through the op's forward, the last T outputs
    // kept. O(L) work per token instead of O(1) rows; CUDA and CPU f32 / bf16 decode through the op (path()).
    auto xs = torch::cat({cache->x, x.detach()}, 1);
    if (commit) {
      cache->x = xs;
      cache->pos = xs.size(1);
    }
    return forward(xs, nullptr).narrow(1, xs.size(1) - x.size(1), x.size(1));
  }
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, HQ_, D_});  // [B, T, HQ, D]
  auto k = k_proj(x).view({B, T, H_, D_});   // [B, T, H, D]
  auto v = v_proj(x).view({B, T, H_, D_});
  if (cfg_.qk_norm) {
    q = maybe_q_norm(q);
    k = maybe_k_norm(k);
  }
  torch::Tensor o;  // [B, T, HQ, D]
  if (uses_path(cfg_.mechanism)) {
    o = path(q, k, v, x, cache, commit);
  } else if (cache == nullptr || cache->empty()) {
    o = softmax_full(q, k, v, x, cache);
  } else {
    o = softmax_decode(q, k, v, x, *cache, commit);
  }
  return o_proj(o.reshape({B, T, HQ_ * D_}));
}

torch::Tensor AttentionImpl::path(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& x, LayerCache* cache, bool commit) {
  const int64_t T = q.size(1);
  torch::Tensor g;  // [B, T, HQ]
  if (uses_gate(cfg_.mechanism)) g = g_of(x);
  const bool decoding = cache != nullptr && !cache->empty();
  torch::Tensor conv_out;
  auto w = w_of(x, decoding ? cache->conv : torch::Tensor(), cache ? &conv_out : nullptr);
  auto beta = beta_of(x);
  if (decoding) {  // S = T tokens in one call of the op's decode (CPU f32, or the CUDA decode kernels)
    auto o = op_decode_step(cache->path, cache->pos, q, k, v, w, beta, g, commit);
    if (commit) {
      cache->conv = conv_out;
      cache->pos += T;
    }
    return o;
  }
  if (run_.sdpa_for_timing && cache == nullptr) {  // PathRunOptions::sdpa_for_timing: not PaTH (timing only)
    auto zero = w.sum() + beta.sum();
    if (g.defined()) zero = zero + g.sum();
    const double scale = 1.0 / std::sqrt(static_cast<double>(D_));
    auto o = softmax_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), {}, scale).transpose(1, 2);
    return o + (0.0 * zero).to(o.scalar_type());
  }
  const bool op_decode = cache != nullptr && op_decode_supported(q);
  auto r = path_attention_call(q, k, v, w, beta, g, op_decode, run_.deterministic_backward);
  if (cache) {  // prefill
    if (op_decode) {
      cache->path = op_decode_start(r.kcache.detach(), v.detach(), g.defined() ? g.detach() : g);
      cache->conv = conv_out;
    } else {
      cache->x = x.detach();
    }
    cache->pos = T;
  }
  return r.o;
}

torch::Tensor AttentionImpl::softmax_full(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& x, LayerCache* cache) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(D_));
  auto qr = q, kr = k;
  if (cfg_.mechanism == Mechanism::rope) {
    qr = rope(q, 0);
    kr = rope(k, 0);
  }
  torch::Tensor G;  // [B, HQ, T]
  if (uses_gate(cfg_.mechanism)) G = g_of(x).cumsum(1).transpose(1, 2);
  auto o = softmax_attention(qr.transpose(1, 2), kr.transpose(1, 2), v.transpose(1, 2), G, scale);
  if (cache) {
    cache->k = kr.transpose(1, 2).detach();
    cache->v = v.transpose(1, 2).detach();
    if (G.defined()) cache->G = G.detach();
    cache->pos = q.size(1);
  }
  return o.transpose(1, 2);  // [B, T, HQ, D]
}

torch::Tensor AttentionImpl::softmax_decode(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            const torch::Tensor& x, LayerCache& cache, bool commit) {
  // q [B, T, HQ, D], k, v [B, T, H, D], x [B, T, E]: T new tokens after cache.pos cached ones.
  const double scale = 1.0 / std::sqrt(static_cast<double>(D_));
  auto qr = q, kr = k;
  if (cfg_.mechanism == Mechanism::rope) {
    qr = rope(q, cache.pos);
    kr = rope(k, cache.pos);
  }
  auto kc = torch::cat({cache.k, kr.transpose(1, 2)}, 2), vc = torch::cat({cache.v, v.transpose(1, 2)}, 2);
  torch::Tensor Gc;
  if (uses_gate(cfg_.mechanism)) {
    auto G = cache.G.narrow(2, cache.pos - 1, 1) + g_of(x).cumsum(1).transpose(1, 2);  // [B, HQ, T]
    Gc = torch::cat({cache.G, G}, 2);
  }
  if (commit) {  // without commit the cache keeps its rows (the new ones are dropped with kc, vc, Gc)
    cache.k = kc;
    cache.v = vc;
    if (Gc.defined()) cache.G = Gc;
    cache.pos += q.size(1);
  }
  return softmax_attention(qr.transpose(1, 2), kc, vc, Gc, scale).transpose(1, 2);
}

}  // namespace pathattn::model
