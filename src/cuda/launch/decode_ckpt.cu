// The checkpointed cache's decode instances (launch/decode_impl.cuh), apart from the plain ones (launch/decode.cu)
// so that the two compile in parallel.
#include "cuda/launch/decode_impl.cuh"

namespace pathattn::cuda {

PATHATTN_DECODE_STEP_INSTANCES(__nv_bfloat16, 64, true)
PATHATTN_DECODE_STEP_INSTANCES(__nv_bfloat16, 128, true)
PATHATTN_DECODE_STEP_INSTANCES(__half, 64, true)
PATHATTN_DECODE_STEP_INSTANCES(__half, 128, true)

}  // namespace pathattn::cuda
