// The CUDA backend of rope_rotate (pathattn.h; kernels/rope.cuh): parameters from the validated views and the dtype
// dispatch.
#include <algorithm>

#include "common/rope.h"
#include "cuda/check.h"
#include "cuda/kernels/rope.cuh"

namespace pathattn::cuda {

void rope_rotate(const RopeProblem& pr, const RopeRotate& in, const TensorView& out) {
  DeviceGuard guard(in.x.device_index);
  cudaStream_t stream = static_cast<cudaStream_t>(in.cuda_stream);
  RopeParams p{};
  p.x = in.x.data;
  p.out = out.data;
  p.cos = static_cast<const float*>(in.cos.data);
  p.sin = static_cast<const float*>(in.sin.data);
  p.x_b = in.x.strides[0], p.x_t = in.x.strides[1], p.x_h = in.x.strides[2];
  p.o_b = out.strides[0], p.o_t = out.strides[1], p.o_h = out.strides[2];
  p.T = static_cast<int>(pr.T), p.H = static_cast<int>(pr.H), p.half = static_cast<int>(pr.D / 2);
  p.rows = static_cast<int>(pr.B * pr.T);
  p.inverse = in.inverse;
  // x-blocks over a position's H * half pairs, y-blocks over positions (the kernel strides over the rest).
  const dim3 grid((p.H * p.half + kRopeThreads - 1) / kRopeThreads,
                  static_cast<unsigned>(std::min<int64_t>(pr.B * pr.T, 65535)));
  switch (in.x.dtype) {
    case DType::bf16:
      rope_kernel<__nv_bfloat16><<<grid, kRopeThreads, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH("rope_kernel<bf16>");
      break;
    case DType::f16:
      rope_kernel<__half><<<grid, kRopeThreads, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH("rope_kernel<f16>");
      break;
    default:
      rope_kernel<float><<<grid, kRopeThreads, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH("rope_kernel<f32>");
      break;
  }
}

}  // namespace pathattn::cuda
