// The one call site of PaTH attention in the model: the torch op (pathattn::path_attention_ex from torch/,
// over the library's CPU/CUDA paths) when that target is built, else the plain-libtorch chunked fallback.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "config.h"

namespace pathattn::model {

struct PathCall {
  torch::Tensor o;       // [B, T, HQ, DV]
  torch::Tensor kcache;  // [B, T, H, D] when asked
};

// Whether the torch op was compiled in (CMake found the target pathattn_torch).
bool have_path_op();

PathCall path_attention_call(PathImpl impl, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& beta,
                             const std::optional<torch::Tensor>& g, bool with_kcache);

}  // namespace pathattn::model
