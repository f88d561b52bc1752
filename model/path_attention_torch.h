// PaTH attention written with plain libtorch ops (autograd comes from torch). Two versions:
//   path_attention_chunked:   the chunked (UT) form of docs/math.md Eqs. 10-15, vectorised over chunks; the
//                             model's fallback when the op target pathattn_torch is not built.
//   path_attention_recurrent: the recurrence of Eqs. 3-4, one token at a time: the model's test oracle.
// Shapes as SPEC 2: q [B, T, HQ, D], k/w [B, T, H, D], v [B, T, H, DV], beta [B, T, H], g [B, T, HQ].
#pragma once

#include <torch/torch.h>

#include <optional>

namespace pathattn::model {

struct PathAttentionTorchOut {
  torch::Tensor o;       // [B, T, HQ, DV]
  torch::Tensor kcache;  // [B, T, H, D], keys carried to the end of the sequence (undefined unless asked)
};

PathAttentionTorchOut path_attention_chunked(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v, const torch::Tensor& w,
                                             const torch::Tensor& beta, const std::optional<torch::Tensor>& g,
                                             std::optional<double> scale, bool with_kcache, int64_t chunk = 64);

torch::Tensor path_attention_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const torch::Tensor& w, const torch::Tensor& beta,
                                       const std::optional<torch::Tensor>& g, std::optional<double> scale);

// Checks the shapes of SPEC 2 and throws std::invalid_argument naming the argument.
void check_path_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& w, const torch::Tensor& beta, const std::optional<torch::Tensor>& g);

}  // namespace pathattn::model
