// Autograd over the ops: the forward saves the inputs, o and lse (O(T) memory, never a T x T matrix); the backward
// calls pathattn::bwd with the gradients of o and lse. Gradients for q, k, v, w, beta, g; none for scale,
// cu_seqlens, the flag.
#include "pathattn_torch.h"

#include <torch/autograd.h>

#include "pathattn_ops.h"

namespace pathattn {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch_ops::opt;
using torch_ops::to_opt;
using torch_ops::to_opt_scale;

struct PathAttentionFunction : torch::autograd::Function<PathAttentionFunction> {
  // Optional tensors travel as optionals: autograd counts an absent one as a non-tensor input (an undefined
  // Tensor would make torch 1.13's Function::apply fail).
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& w, const Tensor& beta, const opt<Tensor>& g, opt<double> scale,
                               const opt<Tensor>& cu_seqlens, bool with_kcache, bool deterministic) {
    auto [o, lse, kcache] = torch_ops::call_fwd(q, k, v, w, beta, g, scale, cu_seqlens, with_kcache);
    // Absent optionals are saved as undefined tensors.
    ctx->save_for_backward({q, k, v, w, beta, g.value_or(Tensor()), cu_seqlens.value_or(Tensor()), o, lse});
    ctx->saved_data["scale"] = scale;  // None: the default D^-0.5
    ctx->saved_data["deterministic"] = deterministic;
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
        torch_ops::call_bwd(q, k, v, w, beta, to_opt(g), sc, to_opt(cu), o, lse, dout, to_opt(grads[1]),
                            ctx->saved_data["deterministic"].toBool());
    return {dq, dk, dv, dw, dbeta, g.defined() ? dg : Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// w = normalize(silu(conv(u))) (docs/math.md Eq. 44-46): saves u, weight, state; the backward recomputes y.
struct ShortConvWFunction : torch::autograd::Function<ShortConvWFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& u, const Tensor& weight, const opt<Tensor>& state,
                               const opt<Tensor>& cu_seqlens, int64_t head_dim, double eps) {
    // weight as conv1d's [C, 1, K] or [C, K]; the op takes [C, K].
    const Tensor w2 = weight.dim() == 3 && weight.size(1) == 1 ? weight.select(1, 0) : weight;
    Tensor w = torch_ops::call_short_conv_w(u, w2, state, cu_seqlens, head_dim, eps);
    ctx->save_for_backward({u, weight, state.value_or(Tensor()), cu_seqlens.value_or(Tensor())});
    ctx->saved_data["head_dim"] = head_dim;
    ctx->saved_data["eps"] = eps;
    return {w};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor &u = s[0], &weight = s[1], &state = s[2], &cu = s[3];
    const Tensor w2 = weight.dim() == 3 && weight.size(1) == 1 ? weight.select(1, 0) : weight;
    const bool want_dstate = state.defined() && state.requires_grad();
    auto [du, dweight, dstate] = torch_ops::call_short_conv_w_bwd(
        u, w2, to_opt(state), to_opt(cu), ctx->saved_data["head_dim"].toInt(), ctx->saved_data["eps"].toDouble(),
        grads[0], want_dstate);
    return {du, dweight.to(weight.scalar_type()).view(weight.sizes()), want_dstate ? dstate : Tensor(), Tensor(),
            Tensor(), Tensor()};
  }
};

// The RoPE rotation: its backward is the transposed rotation of the gradient (rope_rotate's inverse), which
// rounds as the composed form's autograd does.
struct RopeFunction : torch::autograd::Function<RopeFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& cos, const Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return {torch_ops::call_rope(x, cos, sin, false)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    return {torch_ops::call_rope(grads[0], s[0], s[1], true), Tensor(), Tensor()};
  }
};

}  // namespace

torch::Tensor rope_rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return RopeFunction::apply(x, cos, sin)[0];
}

PathAttentionOutput path_attention_ex(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w,
                                      const Tensor& beta, const std::optional<Tensor>& g,
                                      std::optional<double> scale, const std::optional<Tensor>& cu_seqlens,
                                      bool with_kcache, bool deterministic) {
  variable_list r = PathAttentionFunction::apply(q, k, v, w, beta, to_opt(g), to_opt_scale(scale),
                                                  to_opt(cu_seqlens), with_kcache, deterministic);
  return {r[0], r[1], with_kcache ? r[2] : Tensor()};
}

Tensor path_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, const Tensor& beta,
                      const std::optional<Tensor>& g, std::optional<double> scale,
                      const std::optional<Tensor>& cu_seqlens, bool deterministic) {
  return path_attention_ex(q, k, v, w, beta, g, scale, cu_seqlens, false, deterministic).o;
}

torch::Tensor short_conv_w(const torch::Tensor& u, const torch::Tensor& weight,
                           const std::optional<torch::Tensor>& state, const std::optional<torch::Tensor>& cu_seqlens,
                           int64_t head_dim, double eps) {
  return ShortConvWFunction::apply(u, weight, to_opt(state), to_opt(cu_seqlens), head_dim, eps)[0];
}

}  // namespace pathattn
