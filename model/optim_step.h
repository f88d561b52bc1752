// The optimizer step of the trainer on ATen's multi-tensor (foreach) kernels: AdamW on torch::optim::AdamW's own
// options and state, and the gradient clipping before it.
//
// Why: the synthetic tasks' steps are launch-bound on the GPU (docs/results/synthetic: 2.7-8.2 ms per step for
// models of 1-4 layers, a few hundred small kernels each), and torch::optim::AdamW::step issues about nine kernels
// per parameter tensor (weight decay, the two moments, the denominator, the update), the clipping two more: for a
// 4-layer model about 500 of a step's kernels. A foreach op issues one kernel per list of tensors (ATen's
// multi-tensor apply). The optimizer object stays a torch::optim::AdamW and its state (step, exp_avg, exp_avg_sq
// per parameter) is the one it keeps, so checkpoints (torch::save of the optimizer) and torch::optim::AdamW::step
// stay interchangeable with adamw_step_foreach, which does the same operations in the same order per element (bit
// for bit on the CPU, where the foreach ops run per tensor: tests/model/test_model_optim_step.cpp).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace pathattn::model {

// torch::optim::AdamW::step's update for every parameter with a gradient: decoupled weight decay
// p *= 1 - lr wd, the moments m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2, then
// p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps), t the parameter's step count. Refuses amsgrad
// and sparse gradients (std::invalid_argument).
void adamw_step_foreach(torch::optim::AdamW& opt);

// Scales the parameters' gradients by min(1, max_norm / (||g|| + 1e-6)), ||g|| the 2-norm over all of them, with
// torch::nn::utils::clip_grad_norm_'s arithmetic but without reading the norm back to the host, which would
// synchronise with the device at every step. foreach: the per-tensor norms by one foreach op, and the scaling too
// where the libtorch has the foreach multiply by a tensor (2.1 on; per tensor before); else a kernel per tensor for
// each (the same bits as torch's clip_grad_norm_).
void clip_grad_norm_no_sync(const std::vector<torch::Tensor>& params, double max_norm, bool foreach = true);

}  // namespace pathattn::model
