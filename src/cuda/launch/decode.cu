// Launches the decode kernels (kernels/decode.cuh): per new token, the split kernel over (sequence, kv head,
// split) and the combine kernel over (sequence, query head).
#include "cuda/check.h"
#include "cuda/kernels/decode.cuh"
#include "cuda/launch/decode_launch.h"

namespace pathattn::cuda {

template <typename T, int D, int kG>
void launch_decode(const DecodeParams& p, int S, cudaStream_t stream) {
  DecodeParams prm = p;
  prm.S = S;
  const unsigned split_blocks = static_cast<unsigned>(static_cast<int64_t>(p.B) * p.H * p.num_splits);
  const unsigned combine_blocks = static_cast<unsigned>(static_cast<int64_t>(p.B) * p.HQ);
  // The cache's key and value types: f32 / bf16 keys, f32 / T values.
  void (*split)(const DecodeParams) =
      p.ck_bf16 ? (p.cv_low ? decode_split_kernel<T, D, kG, __nv_bfloat16, T> : decode_split_kernel<T, D, kG, __nv_bfloat16, float>)
                : (p.cv_low ? decode_split_kernel<T, D, kG, float, T> : decode_split_kernel<T, D, kG, float, float>);
  for (int s = 0; s < S; ++s) {
    prm.step = s;
    split<<<split_blocks, kDecodeThreads, 0, stream>>>(prm);
    CUDA_CHECK_LAUNCH("decode_split_kernel");
    decode_combine_kernel<T, D><<<combine_blocks, kCombineThreads, 0, stream>>>(prm);
    CUDA_CHECK_LAUNCH("decode_combine_kernel");
  }
}

#define PATHATTN_DECODE_INSTANCES(T, D)                                               \
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
