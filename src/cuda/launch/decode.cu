// The decode launcher (launch/decode_impl.cuh): the plain cache's instances here, the checkpointed cache's in
// launch/decode_ckpt.cu; launch_decode picks between them.
#include "cuda/launch/decode_impl.cuh"

namespace pathattn::cuda {

// Compiled in launch/decode_ckpt.cu, not here.
#define PATHATTN_DECODE_CKPT_EXTERN(T, D)                                                       \
  extern template void launch_decode_steps<T, D, 1, true>(const DecodeParams&, int, cudaStream_t); \
  extern template void launch_decode_steps<T, D, 2, true>(const DecodeParams&, int, cudaStream_t); \
  extern template void launch_decode_steps<T, D, 4, true>(const DecodeParams&, int, cudaStream_t); \
  extern template void launch_decode_steps<T, D, 8, true>(const DecodeParams&, int, cudaStream_t);
PATHATTN_DECODE_CKPT_EXTERN(__nv_bfloat16, 64)
PATHATTN_DECODE_CKPT_EXTERN(__nv_bfloat16, 128)
PATHATTN_DECODE_CKPT_EXTERN(__half, 64)
PATHATTN_DECODE_CKPT_EXTERN(__half, 128)
#undef PATHATTN_DECODE_CKPT_EXTERN

int decode_split_blocks_per_sm(const DecodeParams& p, bool bf16_inputs, int D) {
  return D == 128 && decode_split_is_mma(p, bf16_inputs) ? 1 : 2;
}

template <typename T, int D, int kG>
void launch_decode(const DecodeParams& p, int S, cudaStream_t stream) {
  if (p.ckpt != nullptr)
    launch_decode_steps<T, D, kG, true>(p, S, stream);
  else
    launch_decode_steps<T, D, kG, false>(p, S, stream);
}

#define PATHATTN_DECODE_INSTANCES(T, D)                                               \
  PATHATTN_DECODE_STEP_INSTANCES(T, D, false)                                         \
  template void launch_decode<T, D, 1>(const DecodeParams&, int, cudaStream_t);       \
  template void launch_decode<T, D, 2>(const DecodeParams&, int, cudaStream_t);       \
  template void launch_decode<T, D, 4>(const DecodeParams&, int, cudaStream_t);       \
  template void launch_decode<T, D, 8>(const DecodeParams&, int, cudaStream_t);
PATHATTN_DECODE_INSTANCES(__nv_bfloat16, 64)
PATHATTN_DECODE_INSTANCES(__nv_bfloat16, 128)
PATHATTN_DECODE_INSTANCES(__half, 64)
PATHATTN_DECODE_INSTANCES(__half, 128)
#undef PATHATTN_DECODE_INSTANCES

}  // namespace pathattn::cuda
