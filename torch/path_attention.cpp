// Autograd over the ops: the forward saves the inputs, o and lse (O(T) memory, never a T x T matrix); the backward
// calls pathattn::bwd with the gradients of o and lse. Gradients for q, k, v, w, beta, g; none for scale,
// cu_seqlens, the flag.
#include "pathattn_torch.h"

#include <torch/autograd.h>

#include <algorithm>

#include "pathattn_ops.h"

namespace pathattn {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch_ops::opt;

opt<Tensor> to_opt(const Tensor& t) { return t.defined() ? opt<Tensor>(t) : opt<Tensor>(); }
opt<Tensor> to_opt(const std::optional<Tensor>& t) { return t.has_value() ? to_opt(*t) : opt<Tensor>(); }
opt<double> to_opt_scale(std::optional<double> s) { return s.has_value() ? opt<double>(*s) : opt<double>(); }

struct PathAttentionFunction : torch::autograd::Function<PathAttentionFunction> {
  // Optional tensors travel as optionals: autograd counts an absent one as a non-tensor input (an undefined
  // Tensor would make torch 1.13's Function::apply fail).
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& w, const Tensor& beta, const opt<Tensor>& g, opt<double> scale,
                               const opt<Tensor>& cu_seqlens, bool with_kcache) {
    auto [o, lse, kcache] = torch_ops::call_fwd(q, k, v, w, beta, g, scale, cu_seqlens, with_kcache);
    // Absent optionals are saved as undefined tensors.
    ctx->save_for_backward({q, k, v, w, beta, g.value_or(Tensor()), cu_seqlens.value_or(Tensor()), o, lse});
    ctx->saved_data["scale"] = scale;  // None: the default D^-0.5
    ctx->mark_non_differentiable({kcache});
    // Unused outputs then give undefined gradients instead of zero tensors we would have to inspect.
    ctx->set_materialize_grads(false);
    return {o, lse, kcache};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor &q = s[0], &k = s[1], &v = s[2], &w = s[3], &beta = s[4], &g = s[5], &cu = s[6], &o = s[7],
                 &lse = s[8];
    const c10::IValue& scale = ctx->saved_data["scale"];
    const opt<double> sc = scale.isNone() ? opt<double>() : opt<double>(scale.toDouble());
    const Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(o);  // [B, T, HQ, DV]
    // A loss that uses lse too: dlse enters as delta_i - dlse_i (docs/math.md Eq. 6); undefined: none.
    auto [dq, dk, dv, dw, dbeta, dg] =
        torch_ops::call_bwd(q, k, v, w, beta, to_opt(g), sc, to_opt(cu), o, lse, dout, to_opt(grads[1]));
    return {dq, dk, dv, dw, dbeta, g.defined() ? dg : Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

PathAttentionOutput path_attention_ex(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w,
                                      const Tensor& beta, const std::optional<Tensor>& g,
                                      std::optional<double> scale, const std::optional<Tensor>& cu_seqlens,
                                      bool with_kcache) {
  variable_list r = PathAttentionFunction::apply(q, k, v, w, beta, to_opt(g), to_opt_scale(scale),
                                                  to_opt(cu_seqlens), with_kcache);
  return {r[0], r[1], with_kcache ? r[2] : Tensor()};
}

DecodeState DecodeState::empty(int64_t B, int64_t Tmax, int64_t H, int64_t HQ, int64_t D, int64_t DV, bool gated) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  DecodeState s;
  s.k = torch::zeros({B, Tmax, H, D}, f32);
  s.v = torch::zeros({B, Tmax, H, DV}, f32);
  if (gated) s.gcum = torch::zeros({B, Tmax, HQ}, f32.dtype(torch::kFloat64));
  s.lengths = torch::zeros({B}, f32.dtype(torch::kInt32));
  return s;
}

DecodeState DecodeState::from_prefill(const Tensor& kcache, const Tensor& v, const Tensor& g, int64_t Tmax) {
  TORCH_CHECK(kcache.dim() == 4 && v.dim() == 4, "pathattn: from_prefill: kcache [B, T, H, D] and v [B, T, H, DV] "
              "expected, got ", kcache.sizes(), " and ", v.sizes());
  const int64_t B = kcache.size(0), T = kcache.size(1);
  TORCH_CHECK(Tmax >= T, "pathattn: from_prefill: Tmax = ", Tmax, " must hold the prefill's T = ", T, " tokens");
  TORCH_CHECK(!g.defined() || (g.dim() == 3 && g.size(0) == B && g.size(1) == T),
              "pathattn: from_prefill: g must be [B, T, HQ] = [", B, ", ", T, ", HQ], got ", g.sizes());
  DecodeState s = empty(B, Tmax, kcache.size(2), g.defined() ? g.size(2) : 1, kcache.size(3), v.size(3), g.defined());
  s.k.narrow(1, 0, T).copy_(kcache);
  s.v.narrow(1, 0, T).copy_(v);
  if (g.defined()) s.gcum.narrow(1, 0, T).copy_(g.to(torch::kFloat64).cumsum(1));  // G_t, SPEC 6: in f64
  s.lengths.fill_(static_cast<int32_t>(T));
  return s;
}

void DecodeState::reserve(int64_t n) {
  const int64_t Tmax = k.size(1), need = lengths.max().item<int64_t>() + n;
  if (need <= Tmax) return;
  const int64_t T2 = std::max(2 * Tmax, need);
  auto grow = [&](const Tensor& t) {
    if (!t.defined()) return t;
    auto sizes = t.sizes().vec();
    sizes[1] = T2;
    Tensor g2 = torch::zeros(sizes, t.options());
    g2.narrow(1, 0, Tmax).copy_(t);
    return g2;
  };
  k = grow(k);
  v = grow(v);
  gcum = grow(gcum);
}

DecodeOutput decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, const Tensor& beta,
                    DecodeState& state, const std::optional<Tensor>& g, std::optional<double> scale) {
  torch::NoGradGuard no_grad;
  auto [o, lse] = torch_ops::call_decode(q, k, v, w, beta, to_opt(g), to_opt_scale(scale), state.k, state.v,
                                         to_opt(state.gcum), state.lengths);
  return {o, lse};
}

Tensor path_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, const Tensor& beta,
                      const std::optional<Tensor>& g, std::optional<double> scale,
                      const std::optional<Tensor>& cu_seqlens) {
  return path_attention_ex(q, k, v, w, beta, g, scale, cu_seqlens, false).o;
}

}  // namespace pathattn
