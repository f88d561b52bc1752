// The op schemas and their one implementation, registered for CPU and (when the core has CUDA) for CUDA:
// allocate outputs with torch, call pathattn::forward / backward, which dispatch on the device themselves.
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>

#include "pathattn_ops.h"

#ifdef PATHATTN_TORCH_CUDA_STREAMS
#include <c10/cuda/CUDAStream.h>
#endif

namespace pathattn::torch_ops {
namespace {

using at::Tensor;

// Runs fn, turning the core's errors (pathattn::Error, or any std::exception such as CUDA's "not implemented
// yet") into c10::Error, which Python sees as RuntimeError with the core's message (it names the argument).
template <typename Fn>
auto translate_errors(Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

// torch's current stream on q's device for CUDA tensors, so the op orders like torch's own (a libtorch built
// with CUDA; Debian's is CPU-only and has no CUDA tensors); null (unused) otherwise.
void* kernel_stream(const Tensor& q) {
#ifdef PATHATTN_TORCH_CUDA_STREAMS
  if (q.is_cuda()) return c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
#endif
  (void)q;
  return nullptr;
}

// The CUDA kernels' scratch from torch's caching allocator, on the op's stream: a block freed when the op returns
// is reused only by later work on that stream, after the kernels queued here; and torch's memory statistics
// (max_memory_allocated) count it. `keep` holds the live block until the core call returns. One block at a time:
// a call cut into head slices (Inputs::cuda_workspace_limit) asks once per slice, after queueing the previous
// slice's work, which is all that uses the previous block; freeing it then lets the next slice reuse it in stream
// order, so the peak is one slice's scratch, not the sum of all of them.
std::function<void*(std::size_t)> torch_workspace(const Tensor& like, Tensor* keep) {
  const auto options = like.options().dtype(at::kByte);
  return [keep, options](std::size_t bytes) {
    keep->reset();  // the previous block goes back first, so that this request can reuse it
    *keep = at::empty({static_cast<int64_t>(bytes)}, options);
    return keep->data_ptr();
  };
}

Inputs make_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, const Tensor& beta,
                   const opt<Tensor>& g, opt<double> scale, const opt<Tensor>& cu_seqlens,
                   Tensor* keep = nullptr) {
  Inputs in;
  in.q = to_view(q, "q");
  in.k = to_view(k, "k");
  in.v = to_view(v, "v");
  in.w = to_view(w, "w");
  in.beta = to_view(beta, "beta");
  in.g = to_view(g, "g");
  in.cu_seqlens = to_view(cu_seqlens, "cu_seqlens");
  if (scale.has_value()) in.scale = *scale;
  in.cuda_stream = kernel_stream(q);
  if (keep && q.is_cuda()) in.cuda_workspace = torch_workspace(q, keep);
  return in;
}

// The kernels run on the device of q (cudaSetDevice), as torch's own ops do; nothing for CPU tensors.
opt<c10::Device> kernel_device(const Tensor& q) { return q.is_cuda() ? opt<c10::Device>(q.device()) : opt<c10::Device>(); }

// lse is f32 except in the f64 reference (gradcheck), as the core expects.
at::ScalarType lse_dtype(const Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

std::tuple<Tensor, Tensor, Tensor> fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w,
                                       const Tensor& beta, const opt<Tensor>& g, opt<double> scale,
                                       const opt<Tensor>& cu_seqlens, bool return_kcache) {
  return translate_errors([&] {
    Tensor workspace;
    const Inputs in = make_inputs(q, k, v, w, beta, g, scale, cu_seqlens, &workspace);
    // Shape validation first (throws naming the argument), so that the sizes read below exist.
    supports(in, Backend::automatic);
    const c10::OptionalDeviceGuard guard(kernel_device(q));
    const int64_t B = q.size(0), T = q.size(1), HQ = q.size(2), DV = v.size(3);
    Tensor o = at::empty({B, T, HQ, DV}, v.options());                          // [B, T, HQ, DV]
    Tensor lse = at::empty({B, T, HQ}, q.options().dtype(lse_dtype(q)));       // [B, T, HQ]
    Tensor kcache = return_kcache ? at::empty(k.sizes(), k.options())          // [B, T, H, D]
                                  : at::empty({0}, k.options());
    ForwardOutputs out;
    out.o = to_view(o, "o");
    out.lse = to_view(lse, "lse");
    if (return_kcache) out.kcache = to_view(kcache, "kcache");
    forward(in, out, Backend::automatic);
    return std::make_tuple(o, lse, kcache);
  });
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> bwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                                               const Tensor& w, const Tensor& beta,
                                                               const opt<Tensor>& g, opt<double> scale,
                                                               const opt<Tensor>& cu_seqlens, const Tensor& o,
                                                               const Tensor& lse, const Tensor& dout,
                                                               const opt<Tensor>& dlse, bool deterministic) {
  return translate_errors([&] {
    Tensor workspace;
    Inputs in = make_inputs(q, k, v, w, beta, g, scale, cu_seqlens, &workspace);
    in.deterministic = deterministic;  // CUDA: the fixed summation order (the CPU backward is always deterministic)
    supports(in, Backend::automatic, true);
    const c10::OptionalDeviceGuard guard(kernel_device(q));
    const bool gated = in.g.defined();
    // Outputs get the layout [B, T, ., .] of their inputs' shapes, contiguous, whatever the inputs' strides.
    Tensor dq = at::empty(q.sizes(), q.options());
    Tensor dk = at::empty(k.sizes(), k.options());
    Tensor dv = at::empty(v.sizes(), v.options());
    Tensor dw = at::empty(w.sizes(), w.options());
    Tensor dbeta = at::empty(beta.sizes(), beta.options());
    Tensor dg = gated ? at::empty(g->sizes(), g->options()) : at::empty({0}, q.options());
    Gradients gr;
    gr.dq = to_view(dq, "dq");
    gr.dk = to_view(dk, "dk");
    gr.dv = to_view(dv, "dv");
    gr.dw = to_view(dw, "dw");
    gr.dbeta = to_view(dbeta, "dbeta");
    if (gated) gr.dg = to_view(dg, "dg");
    // Autograd may hand an expanded (stride 0) or otherwise strided gradient; kernels want it dense.
    const Tensor dout_c = dout.contiguous();
    const opt<Tensor> dlse_c = dlse.has_value() && dlse->defined() ? opt<Tensor>(dlse->contiguous()) : opt<Tensor>();
    backward(in, to_view(o, "o"), to_view(lse, "lse"), to_view(dout_c, "do"), to_view(dlse_c, "dlse"), gr,
             Backend::automatic);
    return std::make_tuple(dq, dk, dv, dw, dbeta, dg);
  });
}

// One decoding step of S tokens on a caller-owned cache (docs/spec.md §4, pathattn::decode): the cache tensors are
// updated in place (rows [len, len + S) appended, earlier keys carried), lengths advanced by S; with commit = false
// only o and lse (speculative decoding's verification; the cache is left as it was). Registered for CPU
// and CUDA alike: the dispatcher picks CUDA when any argument is a CUDA tensor, and the core then requires every
// tensor, the cache's included, on q's device (its error names the tensor, e.g. a CPU cache with CUDA inputs:
// "cache.k (output) must be on the device of q (cuda:0), got cpu:0"). On CUDA the kernels run on torch's current
// stream with their scratch from torch's caching allocator, and read lengths on the device (nothing is read back).
std::tuple<Tensor, Tensor> dec(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, const Tensor& beta,
                               const opt<Tensor>& g, opt<double> scale, const Tensor& cache_k, const Tensor& cache_v,
                               const opt<Tensor>& cache_gcum, const Tensor& cache_lengths,
                               const opt<Tensor>& cache_ckpt, const opt<Tensor>& cache_carry,
                               int64_t ckpt_period, bool commit) {
  return translate_errors([&] {
    Tensor workspace;
    const Inputs in = make_inputs(q, k, v, w, beta, g, scale, opt<Tensor>(), &workspace);
    supports(in, Backend::automatic);  // shape validation first: the sizes read below exist
    const c10::OptionalDeviceGuard guard(kernel_device(q));
    DecodeCache cache;
    cache.k = to_view(cache_k, "cache_k");
    cache.v = to_view(cache_v, "cache_v");
    cache.gcum = to_view(cache_gcum, "cache_gcum");
    cache.lengths = to_view(cache_lengths, "cache_lengths");
    cache.ckpt = to_view(cache_ckpt, "cache_ckpt");  // the checkpointed cache (absent: the plain one)
    cache.carry = to_view(cache_carry, "cache_carry");
    cache.ckpt_period = ckpt_period;
    const int64_t B = q.size(0), S = q.size(1), HQ = q.size(2), DV = v.size(3);
    Tensor o = at::empty({B, S, HQ, DV}, v.options());                     // [B, S, HQ, DV]
    Tensor lse = at::empty({B, S, HQ}, q.options().dtype(lse_dtype(q)));  // [B, S, HQ]
    ForwardOutputs out;
    out.o = to_view(o, "o");
    out.lse = to_view(lse, "lse");
    decode(in, cache, out, Backend::automatic, commit);
    return std::make_tuple(o, lse);
  });
}

// The fused short convolution of w (pathattn::short_conv_w, docs/math.md Eq. 44-46). CPU: float32 and float64 in
// the core; 16-bit u is computed as float32 (its du rounded back). weight [C, K] in f32 or u's dtype.
ShortConvW conv_inputs(const Tensor& u, const Tensor& weight, const opt<Tensor>& state, const opt<Tensor>& cu_seqlens,
                       int64_t head_dim, double eps, Tensor* keep) {
  ShortConvW in;
  in.u = to_view(u, "u");
  in.weight = to_view(weight, "weight");
  in.state = to_view(state, "state");
  in.cu_seqlens = to_view(cu_seqlens, "cu_seqlens");
  in.head_dim = head_dim;
  in.eps = eps;
  in.cuda_stream = kernel_stream(u);
  if (u.is_cuda()) in.cuda_workspace = torch_workspace(u, keep);
  return in;
}

// The CPU core computes in float32 / float64: 16-bit CPU tensors go through float32.
bool cpu_16bit(const Tensor& u) { return u.is_cpu() && (u.scalar_type() == at::kHalf || u.scalar_type() == at::kBFloat16); }
opt<Tensor> to_float(const opt<Tensor>& t) { return t.has_value() ? opt<Tensor>(t->to(at::kFloat)) : t; }
at::ScalarType conv_float(const Tensor& u) { return u.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

Tensor conv_w(const Tensor& u, const Tensor& weight, const opt<Tensor>& state, const opt<Tensor>& cu_seqlens,
              int64_t head_dim, double eps) {
  if (cpu_16bit(u)) return conv_w(u.to(at::kFloat), weight.to(at::kFloat), to_float(state), cu_seqlens, head_dim, eps);
  return translate_errors([&] {
    Tensor workspace;
    const ShortConvW in = conv_inputs(u, weight, state, cu_seqlens, head_dim, eps, &workspace);
    const c10::OptionalDeviceGuard guard(kernel_device(u));
    const int64_t B = u.dim() == 3 ? u.size(0) : 0, T = u.dim() == 3 ? u.size(1) : 0;
    const int64_t C = u.dim() == 3 ? u.size(2) : 0, D = head_dim > 0 ? head_dim : 1;
    Tensor w = at::empty({B, T, C / D, D}, u.options().dtype(conv_float(u)));  // [B, T, H, D]
    short_conv_w(in, to_view(w, "w"), Backend::automatic);
    return w;
  });
}

std::tuple<Tensor, Tensor, Tensor> conv_w_bwd(const Tensor& u, const Tensor& weight, const opt<Tensor>& state,
                                              const opt<Tensor>& cu_seqlens, int64_t head_dim, double eps,
                                              const Tensor& dw, bool want_dstate) {
  if (cpu_16bit(u)) {
    auto [du, dweight, dstate] = conv_w_bwd(u.to(at::kFloat), weight.to(at::kFloat), to_float(state), cu_seqlens,
                                            head_dim, eps, dw.to(at::kFloat), want_dstate);
    return std::make_tuple(du.to(u.scalar_type()), dweight, dstate.numel() ? dstate.to(u.scalar_type()) : dstate);
  }
  return translate_errors([&] {
    Tensor workspace;
    const ShortConvW in = conv_inputs(u, weight, state, cu_seqlens, head_dim, eps, &workspace);
    const c10::OptionalDeviceGuard guard(kernel_device(u));
    Tensor du = at::empty(u.sizes(), u.options());
    Tensor dweight = at::empty(weight.sizes(), u.options().dtype(conv_float(u)));
    const bool ds = want_dstate && state.has_value();
    Tensor dstate = ds ? at::empty(state->sizes(), u.options()) : at::empty({0}, u.options());
    const Tensor dw_c = dw.contiguous();  // autograd may hand an expanded gradient
    short_conv_w_backward(in, to_view(dw_c, "dw"), to_view(du, "du"), to_view(dweight, "dweight"),
                          ds ? to_view(dstate, "dstate") : TensorView(), Backend::automatic);
    return std::make_tuple(du, dweight, dstate);
  });
}

// The fused RoPE rotation (pathattn::rope_rotate): x [B, T, H, D] with rows of D contiguous (made so here), cos and
// sin [T, D / 2] f32 (f64 for f64 x), made contiguous. CPU: float32 and float64 (the core's CPU dtypes).
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  return translate_errors([&] {
    const Tensor xc = x.dim() == 4 && x.stride(3) != 1 ? x.contiguous() : x;
    const Tensor c = cos.contiguous(), s = sin.contiguous();
    RopeRotate in;
    in.x = to_view(xc, "x");
    in.cos = to_view(c, "cos");
    in.sin = to_view(s, "sin");
    in.inverse = inverse;
    in.cuda_stream = kernel_stream(x);
    const c10::OptionalDeviceGuard guard(kernel_device(x));
    Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    rope_rotate(in, to_view(out, "out"), Backend::automatic);
    return out;
  });
}

}  // namespace

void check_dense(std::initializer_list<std::pair<const Tensor*, const char*>> args) {
  for (auto [t, name] : args)
    TORCH_CHECK(t == nullptr || !t->defined() || t->layout() == at::kStrided, "pathattn: ", name,
                " must be a strided (dense) tensor, got layout ", t->layout());
}

std::tuple<Tensor, Tensor, Tensor> call_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w,
                                            const Tensor& beta, const opt<Tensor>& g, opt<double> scale,
                                            const opt<Tensor>& cu_seqlens, bool return_kcache) {
  check_dense({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&w, "w"}, {&beta, "beta"}, {g ? &*g : nullptr, "g"},
               {cu_seqlens ? &*cu_seqlens : nullptr, "cu_seqlens"}});
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pathattn::fwd", "").typed<decltype(fwd)>();
  return op.call(q, k, v, w, beta, g, scale, cu_seqlens, return_kcache);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> call_bwd(const Tensor& q, const Tensor& k,
                                                                    const Tensor& v, const Tensor& w,
                                                                    const Tensor& beta, const opt<Tensor>& g,
                                                                    opt<double> scale,
                                                                    const opt<Tensor>& cu_seqlens,
                                                                    const Tensor& o, const Tensor& lse,
                                                                    const Tensor& dout, const opt<Tensor>& dlse,
                                                                    bool deterministic) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pathattn::bwd", "").typed<decltype(bwd)>();
  return op.call(q, k, v, w, beta, g, scale, cu_seqlens, o, lse, dout, dlse, deterministic);
}

std::tuple<Tensor, Tensor> call_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w,
                                       const Tensor& beta, const opt<Tensor>& g, opt<double> scale,
                                       const Tensor& cache_k, const Tensor& cache_v, const opt<Tensor>& cache_gcum,
                                       const Tensor& cache_lengths, const opt<Tensor>& cache_ckpt,
                                       const opt<Tensor>& cache_carry, int64_t ckpt_period, bool commit) {
  check_dense({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&w, "w"}, {&beta, "beta"}, {g ? &*g : nullptr, "g"},
               {&cache_k, "cache_k"}, {&cache_v, "cache_v"}, {cache_gcum ? &*cache_gcum : nullptr, "cache_gcum"},
               {&cache_lengths, "cache_lengths"}, {cache_ckpt ? &*cache_ckpt : nullptr, "cache_ckpt"},
               {cache_carry ? &*cache_carry : nullptr, "cache_carry"}});
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pathattn::decode", "").typed<decltype(dec)>();
  return op.call(q, k, v, w, beta, g, scale, cache_k, cache_v, cache_gcum, cache_lengths, cache_ckpt, cache_carry,
                 ckpt_period, commit);
}

Tensor call_short_conv_w(const Tensor& u, const Tensor& weight, const opt<Tensor>& state,
                         const opt<Tensor>& cu_seqlens, int64_t head_dim, double eps) {
  check_dense({{&u, "u"}, {&weight, "weight"}, {state ? &*state : nullptr, "state"},
               {cu_seqlens ? &*cu_seqlens : nullptr, "cu_seqlens"}});
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pathattn::short_conv_w", "").typed<decltype(conv_w)>();
  return op.call(u, weight, state, cu_seqlens, head_dim, eps);
}

std::tuple<Tensor, Tensor, Tensor> call_short_conv_w_bwd(const Tensor& u, const Tensor& weight,
                                                         const opt<Tensor>& state, const opt<Tensor>& cu_seqlens,
                                                         int64_t head_dim, double eps, const Tensor& dw,
                                                         bool want_dstate) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pathattn::short_conv_w_bwd", "").typed<decltype(conv_w_bwd)>();
  return op.call(u, weight, state, cu_seqlens, head_dim, eps, dw, want_dstate);
}

Tensor call_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  check_dense({{&x, "x"}, {&cos, "cos"}, {&sin, "sin"}});
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pathattn::rope", "").typed<decltype(rope)>();
  return op.call(x, cos, sin, inverse);
}

}  // namespace pathattn::torch_ops

TORCH_LIBRARY(pathattn, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor w, Tensor beta, Tensor? g, float? scale, Tensor? cu_seqlens, "
      "bool return_kcache) -> (Tensor o, Tensor lse, Tensor kcache)");
  m.def(
      "bwd(Tensor q, Tensor k, Tensor v, Tensor w, Tensor beta, Tensor? g, float? scale, Tensor? cu_seqlens, "
      "Tensor o, Tensor lse, Tensor do, Tensor? dlse, bool deterministic=True) -> (Tensor dq, Tensor dk, Tensor dv, "
      "Tensor dw, Tensor dbeta, Tensor dg)");
  m.def(
      "decode(Tensor q, Tensor k, Tensor v, Tensor w, Tensor beta, Tensor? g, float? scale, Tensor(a!) cache_k, "
      "Tensor(b!) cache_v, Tensor(c!)? cache_gcum, Tensor(d!) cache_lengths, Tensor(e!)? cache_ckpt=None, "
      "Tensor(f!)? cache_carry=None, int ckpt_period=0, bool commit=True) -> (Tensor o, Tensor lse)");
  m.def("short_conv_w(Tensor u, Tensor weight, Tensor? state, Tensor? cu_seqlens, int head_dim, float eps=1e-12) -> Tensor");
  m.def(
      "short_conv_w_bwd(Tensor u, Tensor weight, Tensor? state, Tensor? cu_seqlens, int head_dim, float eps, "
      "Tensor dw, bool want_dstate) -> (Tensor du, Tensor dweight, Tensor dstate)");
  m.def("rope(Tensor x, Tensor cos, Tensor sin, bool inverse=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(pathattn, CPU, m) {
  m.impl("fwd", TORCH_FN(pathattn::torch_ops::fwd));
  m.impl("bwd", TORCH_FN(pathattn::torch_ops::bwd));
  m.impl("decode", TORCH_FN(pathattn::torch_ops::dec));
  m.impl("short_conv_w", TORCH_FN(pathattn::torch_ops::conv_w));
  m.impl("short_conv_w_bwd", TORCH_FN(pathattn::torch_ops::conv_w_bwd));
  m.impl("rope", TORCH_FN(pathattn::torch_ops::rope));
}

// The core dispatches on the tensors' device, so CUDA registers the same functions; without CUDA in the
// core there is nothing to register (the op then reports CUDA tensors as unsupported by the dispatcher).
#ifdef PATHATTN_WITH_CUDA
TORCH_LIBRARY_IMPL(pathattn, CUDA, m) {
  m.impl("fwd", TORCH_FN(pathattn::torch_ops::fwd));
  m.impl("bwd", TORCH_FN(pathattn::torch_ops::bwd));
  m.impl("decode", TORCH_FN(pathattn::torch_ops::dec));
  m.impl("short_conv_w", TORCH_FN(pathattn::torch_ops::conv_w));
  m.impl("short_conv_w_bwd", TORCH_FN(pathattn::torch_ops::conv_w_bwd));
  m.impl("rope", TORCH_FN(pathattn::torch_ops::rope));
}
#endif
