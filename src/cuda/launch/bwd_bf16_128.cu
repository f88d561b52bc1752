// The backward's launchers for bf16, D = 128 (bwd_impl.cuh).
#include "cuda/launch/bwd_impl.cuh"

namespace pathattn::cuda {
PATHATTN_BWD_ALL(__nv_bfloat16, 128)
}  // namespace pathattn::cuda
