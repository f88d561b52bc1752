// The fast CPU path: the chunked algorithm of docs/math.md (Eq. 10-17 forward, Eq. 18-30 backward),
// float32, threaded over sequences, heads and chunks. Extra memory is linear in T.
#pragma once

#include "common/problem.h"

namespace pathattn::cpu {

constexpr int64_t kMaxHeadDim = 256;

void forward(const Problem& p, const Inputs& in, const ForwardOutputs& out);
// Appends p.T new tokens per sequence to the cache (validated by the caller: api.cpp).
// commit = false: the outputs only, the cache and lengths untouched (pathattn.h).
void decode(const Problem& p, const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out, bool commit);
// The same on a checkpointed cache (cache.ckpt and carry given; docs/math.md Eq. 35-37).
void decode_checkpointed(const Problem& p, const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out);
void backward(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const TensorView& dlse, const Gradients& grads);

}  // namespace pathattn::cpu
