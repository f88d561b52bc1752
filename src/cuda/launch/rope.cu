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
  p.T = pr.T, p.H = pr.H, p.half = pr.D / 2;
  p.pairs = pr.B * pr.T * pr.H * p.half;
  p.inverse = in.inverse;
  constexpr int kThreads = 256;
  // Enough CTAs to fill every SM several times over; the grid-stride loop takes the rest.
  const int blocks = static_cast<int>(std::min<int64_t>((p.pairs + kThreads - 1) / kThreads, 132 * 32));
  switch (in.x.dtype) {
    case DType::bf16:
      rope_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH("rope_kernel<bf16>");
      break;
    case DType::f16:
      rope_kernel<__half><<<blocks, kThreads, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH("rope_kernel<f16>");
      break;
    default:
      rope_kernel<float><<<blocks, kThreads, 0, stream>>>(p);
      CUDA_CHECK_LAUNCH("rope_kernel<f32>");
      break;
  }
}

}  // namespace pathattn::cuda
