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

PathCall path_attention_call(PathImpl impl, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& beta,
                             const std::optional<torch::Tensor>& g, bool with_kcache) {
#ifdef PATHATTN_MODEL_HAVE_OP
  if (impl == PathImpl::op) {
    // The op's dtypes (SPEC 2): on the CPU every input has q's dtype; on CUDA w, beta and g stay f32.
    const auto dt = q.is_cuda() ? torch::kFloat : q.scalar_type();
    auto wc = w.to(dt), bc = beta.to(dt);
    std::optional<torch::Tensor> gc;
    if (g) gc = g->to(dt);
    if (with_kcache) {
      auto r = pathattn::path_attention_ex(q, k, v, wc, bc, gc, std::nullopt, std::nullopt, true);
      return {r.o, r.kcache};
    }
    return {pathattn::path_attention(q, k, v, wc, bc, gc), {}};
  }
#else
  (void)impl;
#endif
  auto r = path_attention_chunked(q, k, v, w, beta, g, std::nullopt, with_kcache);
  return {r.o, r.kcache};
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
