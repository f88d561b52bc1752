// The registered ops, called through the dispatcher (so CUDA tensors reach the CUDA registration).
// Schemas (torch/ops.cpp):
//   pathattn::fwd(Tensor q, Tensor k, Tensor v, Tensor w, Tensor beta, Tensor? g, float? scale,
//                 Tensor? cu_seqlens, bool return_kcache) -> (Tensor o, Tensor lse, Tensor kcache)
//   pathattn::bwd(Tensor q, Tensor k, Tensor v, Tensor w, Tensor beta, Tensor? g, float? scale,
//                 Tensor? cu_seqlens, Tensor o, Tensor lse, Tensor do, Tensor? dlse)
//                 -> (Tensor dq, Tensor dk, Tensor dv, Tensor dw, Tensor dbeta, Tensor dg)
//   pathattn::decode(Tensor q, Tensor k, Tensor v, Tensor w, Tensor beta, Tensor? g, float? scale,
//                    Tensor(a!) cache_k, Tensor(b!) cache_v, Tensor(c!)? cache_gcum, Tensor(d!) cache_lengths,
//                    Tensor(e!)? cache_ckpt=None, Tensor(f!)? cache_carry=None, int ckpt_period=0,
//                    bool commit=True)
//                 -> (Tensor o, Tensor lse)          (the cache tensors are updated in place, unless commit is
//                                                     false; CPU float32, or CUDA bf16/f16 q, k, v with the cache and
//                                                     lengths on q's device; ckpt, carry and period: the
//                                                     checkpointed cache, CPU and CUDA)
//   pathattn::short_conv_w(Tensor u, Tensor weight, Tensor? state, Tensor? cu_seqlens, int head_dim,
//                          float eps=1e-12) -> Tensor w                (docs/math.md Eq. 44-45: [B, T, H, D] f32)
//   pathattn::short_conv_w_bwd(Tensor u, Tensor weight, Tensor? state, Tensor? cu_seqlens, int head_dim,
//                              float eps, Tensor dw, bool want_dstate)
//                 -> (Tensor du, Tensor dweight, Tensor dstate)       (Eq. 46; dweight f32 [C, K]; dstate [0]
//                                                                      unless want_dstate and state)
//   pathattn::rope(Tensor x, Tensor cos, Tensor sin, bool inverse=False) -> Tensor
//                                                                      (pathattn.h rope_rotate: x's shape and dtype)
// Absent outputs (kcache when not asked for, dg without a gate) are empty tensors of shape [0]: an op's
// Tensor result cannot be None.
#pragma once

#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>

#include "views.h"

namespace pathattn::torch_ops {

// The public API's optionals (std::optional, undefined tensors) as the op signatures' optionals.
inline opt<at::Tensor> to_opt(const at::Tensor& t) { return t.defined() ? opt<at::Tensor>(t) : opt<at::Tensor>(); }
inline opt<at::Tensor> to_opt(const std::optional<at::Tensor>& t) { return t.has_value() ? to_opt(*t) : opt<at::Tensor>(); }
inline opt<double> to_opt_scale(std::optional<double> s) { return s.has_value() ? opt<double>(*s) : opt<double>(); }

// Sparse (or other non-strided) tensors would reach the dispatcher's "no kernel for SparseCPU" message, which
// does not name the argument: check before dispatching. Null or undefined entries are absent optionals.
void check_dense(std::initializer_list<std::pair<const at::Tensor*, const char*>> args);

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_fwd(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v, const at::Tensor& w,
                                                        const at::Tensor& beta, const opt<at::Tensor>& g,
                                                        opt<double> scale, const opt<at::Tensor>& cu_seqlens,
                                                        bool return_kcache);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_bwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& w, const at::Tensor& beta,
    const opt<at::Tensor>& g, opt<double> scale, const opt<at::Tensor>& cu_seqlens, const at::Tensor& o,
    const at::Tensor& lse, const at::Tensor& dout, const opt<at::Tensor>& dlse, bool deterministic = true);

std::tuple<at::Tensor, at::Tensor> call_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const at::Tensor& w, const at::Tensor& beta, const opt<at::Tensor>& g,
                                               opt<double> scale, const at::Tensor& cache_k,
                                               const at::Tensor& cache_v, const opt<at::Tensor>& cache_gcum,
                                               const at::Tensor& cache_lengths,
                                               const opt<at::Tensor>& cache_ckpt = opt<at::Tensor>(),
                                               const opt<at::Tensor>& cache_carry = opt<at::Tensor>(),
                                               int64_t ckpt_period = 0, bool commit = true);

at::Tensor call_short_conv_w(const at::Tensor& u, const at::Tensor& weight, const opt<at::Tensor>& state,
                             const opt<at::Tensor>& cu_seqlens, int64_t head_dim, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> call_short_conv_w_bwd(const at::Tensor& u, const at::Tensor& weight,
                                                                     const opt<at::Tensor>& state,
                                                                     const opt<at::Tensor>& cu_seqlens,
                                                                     int64_t head_dim, double eps,
                                                                     const at::Tensor& dw, bool want_dstate);
at::Tensor call_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse);

}  // namespace pathattn::torch_ops
