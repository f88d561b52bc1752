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

}  // namespace pathattn::model
