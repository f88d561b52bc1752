// The model's arithmetic precision: f32 everywhere, or bf16 autocast over f32 parameters (mixed precision).
//
// Why autocast and not a bf16 copy of the model with an f32 master: autocast needs no second set of parameters
// and no copying in the trainer; the parameters, their gradients and AdamW stay f32 (the parameters are the
// master copy), matmuls (linear, SDPA) run in bf16, and autocast's own lists keep norms, softmax and the loss in
// f32. The residual stream stays f32 too (the embedding is not on autocast's lists; bf16 + f32 adds to f32).
// The same model code serves both precisions; the PaTH call site casts to the op's dtypes (path_op.cpp).
#pragma once

#include <torch/torch.h>

#include <string>

namespace pathattn::model {

enum class Precision { f32, bf16 };

const char* precision_name(Precision p);
// "f32", "bf16", or "auto": bf16 on CUDA, f32 on the CPU (the CPU op computes in f32 anyway).
Precision parse_precision(const std::string& s, torch::Device dev);

// Turns autocast to bf16 on for dev's device type while alive; does nothing for f32. On exit it restores the
// previous state and clears autocast's cache of cast weights: those casts would be stale after the optimizer
// step. Keep backward() outside the guard (autograd replays the forward's dtypes), as torch.autocast advises.
class AutocastGuard {
 public:
  AutocastGuard(torch::Device dev, Precision p);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  torch::DeviceType type_ = torch::kCPU;
  bool prev_enabled_ = false;
  torch::ScalarType prev_dtype_ = torch::kFloat;
};

}  // namespace pathattn::model
