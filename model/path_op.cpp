#include "path_op.h"

#include <optional>

namespace pathattn::model {

namespace {
// The dtype each input goes to (docs/spec.md §2): CUDA takes q, k, v in bf16 (f16 passes through) and w, beta, g in f32;
// the CPU takes every input in one dtype, f32 (f64 for the tests). Under bf16 autocast q, k, v arrive in bf16 and
// w, beta, g in f32 (attention.cpp computes them in f32), so on CUDA nothing is copied.
struct CallDtypes {
  torch::ScalarType qkv, wbg;
};
CallDtypes call_dtypes(const torch::Tensor& q) {
  const auto st = q.scalar_type();
  if (q.is_cuda()) return {st == torch::kBFloat16 || st == torch::kHalf ? st : torch::kBFloat16, torch::kFloat};
  const auto acc = st == torch::kDouble ? torch::kDouble : torch::kFloat;
  return {acc, acc};
}
std::optional<torch::Tensor> opt(const torch::Tensor& t) { return t.defined() ? std::optional(t) : std::nullopt; }
constexpr int64_t kRoom = 64;  // tokens of room added at prefill; doubled when full
}  // namespace

PathCall path_attention_call(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& w, const torch::Tensor& beta, const torch::Tensor& g,
                             bool with_kcache, bool deterministic) {
  const CallDtypes dt = call_dtypes(q);
  auto ex = pathattn::path_attention_ex(q.to(dt.qkv), k.to(dt.qkv), v.to(dt.qkv), w.to(dt.wbg), beta.to(dt.wbg),
                                        g.defined() ? opt(g.to(dt.wbg)) : std::nullopt, std::nullopt, std::nullopt,
                                        with_kcache, deterministic);
  // The caller gets its own dtypes back (o like v, the key cache like k): o_proj's input under f32 runs.
  PathCall r{ex.o.to(v.scalar_type()), {}};
  if (with_kcache) r.kcache = ex.kcache.to(k.scalar_type());
  return r;
}

bool op_decode_supported(const torch::Tensor& q) { return q.is_cuda() || q.scalar_type() != torch::kDouble; }

pathattn::DecodeState op_decode_start(const torch::Tensor& kcache, const torch::Tensor& v, const torch::Tensor& g) {
  // from_prefill stores k, v in f32 and the cumulative gates in f64, on kcache's device, whatever their dtypes.
  return pathattn::DecodeState::from_prefill(kcache, v, g, kcache.size(1) + kRoom);
}

torch::Tensor op_decode_step(pathattn::DecodeState& st, int64_t cached, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& beta,
                             const torch::Tensor& g, bool commit) {
  const int64_t S = q.size(1);
  if (cached + S > st.k.size(1)) st.reserve(S);
  const CallDtypes dt = call_dtypes(q);  // CPU: f32 (op_decode_supported excludes f64); CUDA: bf16 / f16 and f32
  auto out = pathattn::decode(q.to(dt.qkv), k.to(dt.qkv), v.to(dt.qkv), w.to(dt.wbg), beta.to(dt.wbg), st,
                              g.defined() ? opt(g.to(dt.wbg)) : std::nullopt, std::nullopt, commit);
  return out.o.to(v.scalar_type());
}

}  // namespace pathattn::model
