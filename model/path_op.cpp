#include "path_op.h"

#include "path_attention_torch.h"

#ifdef PATHATTN_MODEL_HAVE_OP
#include "pathattn_torch.h"
#endif

namespace pathattn::model {

bool have_path_op() {
#ifdef PATHATTN_MODEL_HAVE_OP
  return true;
#else
  return false;
#endif
}

namespace {
// The dtype each input goes to for this call. The op (SPEC 2): CUDA takes q, k, v in bf16 (f16 passes through)
// and w, beta, g in f32; the CPU takes every input in one dtype, f32 (f64 for the tests). The plain-libtorch form
// runs in f32 (f64 kept): its triangular solve has no bf16 kernel. Under bf16 autocast q, k, v arrive in bf16
// and w, beta, g in f32 (attention.cpp computes them in f32), so on CUDA nothing is copied.
struct CallDtypes {
  torch::ScalarType qkv, wbg;
};
CallDtypes call_dtypes(PathImpl impl, const torch::Tensor& q) {
  const auto st = q.scalar_type();
  const auto acc = st == torch::kDouble ? torch::kDouble : torch::kFloat;
  if (impl == PathImpl::op && q.is_cuda()) {
    return {st == torch::kBFloat16 || st == torch::kHalf ? st : torch::kBFloat16, torch::kFloat};
  }
  return {acc, acc};
}
}  // namespace

PathCall path_attention_call(PathImpl impl, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& beta,
                             const std::optional<torch::Tensor>& g, bool with_kcache) {
#ifndef PATHATTN_MODEL_HAVE_OP
  impl = PathImpl::torch;
#endif
  const CallDtypes dt = call_dtypes(impl, q);
  auto qc = q.to(dt.qkv), kc = k.to(dt.qkv), vc = v.to(dt.qkv), wc = w.to(dt.wbg), bc = beta.to(dt.wbg);
  std::optional<torch::Tensor> gc;
  if (g) gc = g->to(dt.wbg);
  PathCall r;
#ifdef PATHATTN_MODEL_HAVE_OP
  if (impl == PathImpl::op) {
    if (with_kcache) {
      auto ex = pathattn::path_attention_ex(qc, kc, vc, wc, bc, gc, std::nullopt, std::nullopt, true);
      r = {ex.o, ex.kcache};
    } else {
      r = {pathattn::path_attention(qc, kc, vc, wc, bc, gc), {}};
    }
  }
#endif
  if (impl == PathImpl::torch) {
    auto ch = path_attention_chunked(qc, kc, vc, wc, bc, gc, std::nullopt, with_kcache);
    r = {ch.o, ch.kcache};
  }
  // The caller gets its own dtypes back (o like v, the key cache like k): o_proj's input under f32 runs.
  r.o = r.o.to(v.scalar_type());
  if (r.kcache.defined()) r.kcache = r.kcache.to(k.scalar_type());
  return r;
}

bool op_decode_available(PathImpl impl, const torch::Tensor& q) {
  return have_path_op() && impl == PathImpl::op && q.device().is_cpu() && q.scalar_type() == torch::kFloat;
}

#ifdef PATHATTN_MODEL_HAVE_OP
namespace {
OpDecodeState from_core(const pathattn::DecodeState& d) { return {d.k, d.v, d.gcum, d.lengths}; }
pathattn::DecodeState to_core(const OpDecodeState& s) { return {s.k, s.v, s.gcum, s.lengths}; }
constexpr int64_t kRoom = 64;  // tokens of room added at prefill; doubled when full
}  // namespace

OpDecodeState op_decode_start(const torch::Tensor& kcache, const torch::Tensor& v, const torch::Tensor& g) {
  return from_core(pathattn::DecodeState::from_prefill(kcache, v, g, kcache.size(1) + kRoom));
}

torch::Tensor op_decode_step(OpDecodeState& st, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& w, const torch::Tensor& beta, const torch::Tensor& g) {
  pathattn::DecodeState core = to_core(st);
  core.reserve(q.size(1));
  auto out = pathattn::decode(q, k, v, w.to(torch::kFloat), beta.to(torch::kFloat), core,
                              g.defined() ? std::optional<torch::Tensor>(g.to(torch::kFloat)) : std::nullopt);
  st = from_core(core);
  return out.o;
}
#else
OpDecodeState op_decode_start(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  throw std::logic_error("pathattn model: the torch op is not built (op_decode_available() is false)");
}
torch::Tensor op_decode_step(OpDecodeState&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                             const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  throw std::logic_error("pathattn model: the torch op is not built (op_decode_available() is false)");
}
#endif

}  // namespace pathattn::model
