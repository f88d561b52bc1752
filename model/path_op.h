// The one call site of PaTH attention in the model: the torch op (torch/pathattn_torch.h: pathattn::path_attention_ex
// for training and prefill, pathattn::decode for decoding), with the casts to the dtypes the op takes. The model has
// no PaTH implementation of its own.
#pragma once

#include <torch/torch.h>

#include "pathattn_torch.h"

namespace pathattn::model {

struct PathCall {
  torch::Tensor o;       // [B, T, HQ, DV], in v's dtype
  torch::Tensor kcache;  // [B, T, H, D] keys carried to the end (docs/spec.md §4), when asked
};

// q [B, T, HQ, D], k and w [B, T, H, D], v [B, T, H, DV], beta [B, T, H], g [B, T, HQ] or undefined (no gate).
// Differentiable in all of them (the op's autograd).
PathCall path_attention_call(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& w, const torch::Tensor& beta, const torch::Tensor& g,
                             bool with_kcache);

// Whether the op's decode can take the next steps of a generation whose prefill ran on q: it is CPU float32 for
// now (a CPU f32 or bf16-autocast run; not f64, not CUDA until the CUDA decode kernel exists).
bool op_decode_supported(const torch::Tensor& q);
// The decoding state after a prefill: kcache and v [B, T, H, D], g [B, T, HQ] or undefined; room for more tokens.
pathattn::DecodeState op_decode_start(const torch::Tensor& kcache, const torch::Tensor& v, const torch::Tensor& g);
// S tokens per sequence through pathattn::decode: q [B, S, HQ, D], k, w [B, S, H, D], v [B, S, H, DV], beta [B, S, H],
// g [B, S, HQ] or undefined -> o [B, S, HQ, DV] in v's dtype. Grows the state's room when it is full.
torch::Tensor op_decode_step(pathattn::DecodeState& st, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& beta,
                             const torch::Tensor& g);

}  // namespace pathattn::model
