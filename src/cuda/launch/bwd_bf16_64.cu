// The backward's launchers for bf16, D = 64 (bwd_impl.cuh).
#include "cuda/launch/bwd_impl.cuh"

namespace pathattn::cuda {
PATHATTN_BWD_ALL(__nv_bfloat16, 64)
}  // namespace pathattn::cuda
