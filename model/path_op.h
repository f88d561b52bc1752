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
// Differentiable in all of them (the op's autograd). deterministic: the op's flag, the CUDA backward's fixed
// summation order (the same bits on every run) or, false, its faster atomic order (docs/cuda.md); the flag does not
// change the CPU backward.
PathCall path_attention_call(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& w, const torch::Tensor& beta, const torch::Tensor& g,
                             bool with_kcache, bool deterministic = true);

// Whether the op's decode can take the next steps of a generation whose prefill ran on q: on the CPU unless q is
// float64 (the CPU decode is float32; f64 is the tests' reference precision, whose model re-runs the sequence), on
// CUDA always (the CUDA decode takes the forward's dtypes and head dimensions, and q, k, v are cast to bfloat16 as
// path_attention_call casts them).
bool op_decode_supported(const torch::Tensor& q);
// The decoding state after a prefill, on kcache's device: kcache and v [B, T, H, D], g [B, T, HQ] or undefined; room
// for more tokens.
pathattn::DecodeState op_decode_start(const torch::Tensor& kcache, const torch::Tensor& v, const torch::Tensor& g);
// S tokens per sequence through pathattn::decode, `cached` tokens already in the state (every sequence of the batch
// has the same count): q [B, S, HQ, D], k, w [B, S, H, D], v [B, S, H, DV], beta [B, S, H], g [B, S, HQ] or undefined
// -> o [B, S, HQ, DV] in v's dtype. The op's dtypes per device: CPU every input in f32; CUDA q, k, v in bf16 (f16
// kept), w, beta, g in f32; the state is f32 either way. Grows the state's room when the S tokens would not fit
// (the only time it reads the lengths back from the device). commit = false: the state is left as it was.
torch::Tensor op_decode_step(pathattn::DecodeState& st, int64_t cached, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& beta,
                             const torch::Tensor& g, bool commit = true);

}  // namespace pathattn::model
