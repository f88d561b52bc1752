// The CUDA backend as src/common/api.cpp calls it (only when PATHATTN_WITH_CUDA is defined).
// Arguments arrive validated by make_problem; supports() adds what the kernels need.
#pragma once

#include "common/problem.h"

namespace pathattn::cuda {

Support supports(const Problem& p, const Inputs& in, bool backward);
void forward(const Problem& p, const Inputs& in, const ForwardOutputs& out);
void backward(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const TensorView& dlse, const Gradients& grads);
// Decoding (kernels/decode.cuh): what supports() says plus nothing decode-specific about the inputs; the cache's
// layout is checked by decode(), which throws Error.
Support supports_decode(const Problem& p, const Inputs& in);
// commit = false: the outputs only, through the chunked kernels (S <= 64), the cache and lengths untouched.
void decode(const Problem& p, const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out, bool commit);

}  // namespace pathattn::cuda
