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

// Decoding through the op's fused step (pathattn::decode over the core's decode(): the cache is carried by each
// new token's Householder factor in place, no reallocation per token). CPU float32 only; the model's own
// libtorch update (attention.cpp) serves every other case.
struct OpDecodeState {
  torch::Tensor k, v, gcum, lengths;  // [B, Tmax, H, D], [B, Tmax, H, DV], [B, Tmax, H] f64 or undefined, [B] int32
  bool active() const { return k.defined(); }
};

// Whether decoding with these tensors can go through the op (it is built, PathImpl::op, CPU float32).
bool op_decode_available(PathImpl impl, const torch::Tensor& q);
// The state after a prefill: kcache and v [B, T, H, D], g [B, T, H] (undefined without a gate); room for more.
OpDecodeState op_decode_start(const torch::Tensor& kcache, const torch::Tensor& v, const torch::Tensor& g);
// One step of S tokens: q, k, v, w [B, S, H, D], beta and g [B, S, H] (g undefined without a gate) -> o [B, S, H, D].
// Doubles the state's room when it is full.
torch::Tensor op_decode_step(OpDecodeState& st, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& w, const torch::Tensor& beta, const torch::Tensor& g);

}  // namespace pathattn::model
