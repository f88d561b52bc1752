#include "attention.h"

#include <torch/version.h>

#include <cmath>

#include "path_op.h"

namespace pathattn::model {

namespace {
// f32 for every low-precision or f32 tensor (SPEC 6: beta, w, g, softmax in f32), f64 kept for f64 tests.
torch::ScalarType acc(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}
}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto xf = x.to(acc(x));
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps_);
  return (y * weight).to(x.scalar_type());
}

torch::Tensor softmax_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& G, double scale) {
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

AttentionImpl::AttentionImpl(const ModelConfig& cfg) : cfg_(cfg), H_(cfg.n_head), D_(cfg.head_dim()) {
  const int64_t E = cfg.d_model, HD = H_ * D_;
  auto lin = [&](const char* name, int64_t in, int64_t out, bool bias) {
    auto l = register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)));
    torch::nn::init::normal_(l->weight, 0.0, 0.02);  // SPEC 5: N(0, 0.02), biases 0
    if (bias) torch::nn::init::zeros_(l->bias);
    return l;
  };
  q_proj = lin("q_proj", E, HD, false);
  k_proj = lin("k_proj", E, HD, false);
  v_proj = lin("v_proj", E, HD, false);
  o_proj = lin("o_proj", HD, E, false);
  if (uses_path(cfg.mechanism)) {
    w_down = lin("w_down", E, cfg.w_rank, false);
    w_up = lin("w_up", cfg.w_rank, HD, false);
    // The conv keeps PyTorch's Conv1d default init (uniform +-1/sqrt(fan_in), fan_in = 3), as fla's
    // ShortConvolution does; N(0, 0.02) taps would only rescale w before its L2 norm.
    conv_w = register_parameter("conv_w", torch::empty({HD, 3}).uniform_(-1.0 / std::sqrt(3.0), 1.0 / std::sqrt(3.0)));
    beta_proj = lin("beta_proj", E, H_, true);  // bias 0: beta starts at 1
  }
  if (uses_gate(cfg.mechanism)) gate_proj = lin("gate_proj", E, H_, true);
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(D_));
    k_norm = register_module("k_norm", RMSNorm(D_));
  }
}

torch::Tensor AttentionImpl::w_of(const torch::Tensor& x, const torch::Tensor& conv_state, torch::Tensor* conv_out) {
  const int64_t B = x.size(0), T = x.size(1), HD = H_ * D_;
  auto u = w_up(w_down(x));  // [B, T, H*D]
  auto state = conv_state.defined() ? conv_state : torch::zeros({B, 2, HD}, u.options());
  auto up = torch::cat({state, u}, 1);  // [B, T + 2, H*D]
  // Causal depthwise conv of size 3: y_t = c0 u_{t-2} + c1 u_{t-1} + c2 u_t.
  auto y = up.narrow(1, 0, T) * conv_w.select(1, 0) + up.narrow(1, 1, T) * conv_w.select(1, 1) +
           up.narrow(1, 2, T) * conv_w.select(1, 2);
  if (conv_out) *conv_out = up.narrow(1, T, 2).detach();
  auto w = torch::silu(y).view({B, T, H_, D_}).to(acc(y));
  return torch::nn::functional::normalize(w, torch::nn::functional::NormalizeFuncOptions().p(2).dim(-1).eps(1e-6));
}

torch::Tensor AttentionImpl::beta_of(const torch::Tensor& x) {
  auto beta = 2.0 * torch::sigmoid(beta_proj(x).to(acc(x)));  // [B, T, H]
  if (cfg_.beta_max > 0) beta = beta.clamp(0.0, cfg_.beta_max);
  return beta;
}

torch::Tensor AttentionImpl::g_of(const torch::Tensor& x) {
  return torch::log_sigmoid(gate_proj(x).to(acc(x)));  // [B, T, H]
}

torch::Tensor AttentionImpl::rope(const torch::Tensor& x, int64_t pos0) const {
  const int64_t T = x.size(1), half = D_ / 2;
  auto fopts = torch::TensorOptions().dtype(acc(x)).device(x.device());
  auto inv = torch::pow(cfg_.rope_base, -torch::arange(half, fopts) / static_cast<double>(half));  // [D/2]
  auto ang = torch::arange(pos0, pos0 + T, fopts).unsqueeze(1) * inv.unsqueeze(0);              // [T, D/2]
  auto cos = ang.cos().view({1, T, 1, half}), sin = ang.sin().view({1, T, 1, half});
  auto x1 = x.narrow(-1, 0, half).to(acc(x)), x2 = x.narrow(-1, half, half).to(acc(x));
  return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1).to(x.scalar_type());
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, LayerCache* cache) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, H_, D_});  // [B, T, H, D]
  auto k = k_proj(x).view({B, T, H_, D_});
  auto v = v_proj(x).view({B, T, H_, D_});
  if (cfg_.qk_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  torch::Tensor o;  // [B, T, H, D]
  if (cache == nullptr || cache->empty()) {
    o = full(q, k, v, x, cache);
  } else {
    std::vector<torch::Tensor> outs;
    for (int64_t t = 0; t < T; ++t) {
      outs.push_back(decode_one(q.narrow(1, t, 1), k.narrow(1, t, 1), v.narrow(1, t, 1), x.narrow(1, t, 1), *cache));
    }
    o = torch::cat(outs, 1);
  }
  return o_proj(o.reshape({B, T, H_ * D_}));
}

torch::Tensor AttentionImpl::full(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& x, LayerCache* cache) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(D_));
  const Mechanism m = cfg_.mechanism;
  torch::Tensor g;  // [B, T, H]
  if (uses_gate(m)) g = g_of(x);
  if (uses_path(m)) {
    torch::Tensor conv_out;
    auto w = w_of(x, {}, cache ? &conv_out : nullptr);
    auto beta = beta_of(x);
    auto r = path_attention_call(cfg_.path_impl, q, k, v, w, beta,
                                 g.defined() ? std::optional<torch::Tensor>(g) : std::nullopt, cache != nullptr);
    if (cache) {
      if (op_decode_available(cfg_.path_impl, q)) {
        cache->op = op_decode_start(r.kcache.detach(), v.detach(), g.defined() ? g.detach() : torch::Tensor());
      } else {
        cache->k = r.kcache.transpose(1, 2).detach();  // [B, H, T, D]
        cache->v = v.transpose(1, 2).detach();
        if (g.defined()) cache->G = g.cumsum(1).transpose(1, 2).detach();
      }
      cache->conv = conv_out;
      cache->pos = q.size(1);
    }
    return r.o;
  }
  auto qr = q, kr = k;
  if (m == Mechanism::rope) {
    qr = rope(q, 0);
    kr = rope(k, 0);
  }
  torch::Tensor G;  // [B, H, T]
  if (g.defined()) G = g.cumsum(1).transpose(1, 2);
  auto o = softmax_attention(qr.transpose(1, 2), kr.transpose(1, 2), v.transpose(1, 2), G, scale);
  if (cache) {
    cache->k = kr.transpose(1, 2).detach();
    cache->v = v.transpose(1, 2).detach();
    if (G.defined()) cache->G = G.detach();
    cache->pos = q.size(1);
  }
  return o.transpose(1, 2);  // [B, T, H, D]
}

torch::Tensor AttentionImpl::decode_one(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const torch::Tensor& x, LayerCache& cache) {
  // q, k, v [B, 1, H, D], x [B, 1, E]
  const double scale = 1.0 / std::sqrt(static_cast<double>(D_));
  const Mechanism m = cfg_.mechanism;
  auto qh = q.transpose(1, 2), kh = k.transpose(1, 2);  // [B, H, 1, D]
  if (uses_path(m) && cache.op.active()) {  // the op's fused step (CPU f32)
    torch::Tensor conv_out;
    auto w = w_of(x, cache.conv, &conv_out);  // [B, 1, H, D]
    cache.conv = conv_out;
    auto o = op_decode_step(cache.op, q, k, v, w, beta_of(x), uses_gate(m) ? g_of(x) : torch::Tensor());
    cache.pos += 1;
    return o;  // [B, 1, H, D]
  }
  if (uses_path(m)) {
    torch::Tensor conv_out;
    auto w = w_of(x, cache.conv, &conv_out).transpose(1, 2).to(q.scalar_type());  // [B, H, 1, D]
    auto beta = beta_of(x).transpose(1, 2).unsqueeze(-1).to(q.scalar_type());     // [B, H, 1, 1]
    cache.conv = conv_out;
    // SPEC 4 / Eq. 3: H_t applied to every cached key, then k_t appended untransformed.
    cache.k = cache.k - beta * (cache.k * w).sum(-1, true) * w;
  } else if (m == Mechanism::rope) {
    qh = rope(q, cache.pos).transpose(1, 2);
    kh = rope(k, cache.pos).transpose(1, 2);
  }
  cache.k = torch::cat({cache.k, kh}, 2);
  cache.v = torch::cat({cache.v, v.transpose(1, 2)}, 2);
  torch::Tensor G;
  if (uses_gate(m)) {
    auto g = g_of(x).transpose(1, 2);  // [B, H, 1]
    cache.G = torch::cat({cache.G, cache.G.narrow(2, cache.pos - 1, 1) + g}, 2);
    G = cache.G;
  }
  cache.pos += 1;
  auto o = softmax_attention(qh, cache.k, cache.v, G, scale);  // [B, H, 1, D]
  return o.transpose(1, 2);
}

}  // namespace pathattn::model
