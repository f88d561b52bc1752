// The reference: the recurrence of docs/spec.md §1 written for clarity (docs/math.md, Eq. 1-4 forward,
// Eq. 5-9 backward). Computes in double for f64 inputs and in float for f32 inputs.
// Cost: O(T^2 D) time; the backward keeps every transformed key, O(T^2 D) memory per head.
#pragma once

#include "common/problem.h"

namespace pathattn::ref {

void forward(const Problem& p, const Inputs& in, const ForwardOutputs& out);
void backward(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const TensorView& dlse, const Gradients& grads);

}  // namespace pathattn::ref
