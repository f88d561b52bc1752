// Runs the forward's kernels for one validated call (dispatch.cu turns dtype / D / gate into templates).
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode_params.h"
#include "cuda/launch/launch.h"
#include "cuda/params.h"
#include "pathattn/pathattn.h"

namespace pathattn::cuda {

// Precondition: supports() said yes (dtype bf16/f16, D in {64, 128}).
void run_forward(const FwdParams& p, DType dtype, int D, bool gate, bool kcache, cudaStream_t stream);

// The backward's resident grid for these template values (sizes the scratch slots before the workspace exists).
BwdGrid backward_grid(DType dtype, int D, bool gate, bool deterministic, int group);
void run_backward(const BwdParams& p, const BwdGrid& grid, DType dtype, int D, bool gate, cudaStream_t stream);

// S decoding steps (kernels/decode.cuh). Precondition: dtype bf16/f16, D in {64, 128}.
void run_decode(const DecodeParams& p, DType dtype, int D, int S, cudaStream_t stream);

}  // namespace pathattn::cuda
