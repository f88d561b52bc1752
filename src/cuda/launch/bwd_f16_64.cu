// The backward's launchers for f16, D = 64 (bwd_impl.cuh).
#include "cuda/launch/bwd_impl.cuh"

namespace pathattn::cuda {
PATHATTN_BWD_ALL(__half, 64)
}  // namespace pathattn::cuda
