// Runs the forward's kernels for one validated call (dispatch.cu turns dtype / D / gate into templates).
#pragma once

#include <cuda_runtime.h>

#include "cuda/params.h"
#include "pathattn/pathattn.h"

namespace pathattn::cuda {

// Precondition: supports() said yes (dtype bf16/f16, D in {64, 128}).
void run_forward(const Params& p, DType dtype, int D, bool gate, bool kcache, cudaStream_t stream);

}  // namespace pathattn::cuda
