// Kernel launchers, one per stage, each instantiated for the dtypes and head dimensions in its launch/*.cu.
// dispatch.cu picks the instance; nothing else includes the kernels.
#pragma once

#include <cuda_runtime.h>

#include "cuda/params.h"

namespace pathattn::cuda {

void launch_gate(const Params& p, cudaStream_t stream);
template <typename T, int D>
void launch_prep(const Params& p, cudaStream_t stream);
template <typename T, int D>
void launch_prep_tc(const Params& p, cudaStream_t stream);
template <typename T, int D, bool kGate>
void launch_fwd(const Params& p, cudaStream_t stream);
template <typename T, int D>
void launch_kcache(const Params& p, cudaStream_t stream);

}  // namespace pathattn::cuda
