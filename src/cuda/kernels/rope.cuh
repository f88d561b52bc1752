// The fused RoPE rotation (pathattn.h `rope_rotate`; the CPU statement is src/cpu/rope.cpp): one thread per pair
// (x1[j], x2[j]) of a head, striding over the positions. A warp reads 32 consecutive 16-bit elements of each half (whole 32-byte
// sectors), so the kernel moves x once in and once out; the cos / sin tables ([T, D / 2] f32) stay in L2.
// The products and the sum use __fmul_rn / __fadd_rn / __fsub_rn, which nvcc never contracts into an FMA: each
// product is rounded before the sum, as in the ATen composition (a mul kernel per product, a sub / add kernel) that
// this replaces, and the result is rounded once to x's dtype (round to nearest even, as ATen's conversion), so the
// two agree bit for bit.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/common.cuh"

namespace pathattn::cuda {

struct RopeParams {
  const void* x;
  void* out;
  const float* cos;
  const float* sin;
  int64_t x_b, x_t, x_h;  // element strides of x (its D stride is 1)
  int64_t o_b, o_t, o_h;  // of out
  int T, H, half;
  int rows;  // B * T
  bool inverse;
};

constexpr int kRopeThreads = 128;

template <typename X>
__device__ __forceinline__ float rope_load(const X* p) {
  if constexpr (std::is_same_v<X, float>)
    return *p;
  else
    return TypeTraits<X>::to_float(*p);
}
template <typename X>
__device__ __forceinline__ void rope_store(X* p, float v) {
  if constexpr (std::is_same_v<X, float>)
    *p = v;
  else
    *p = TypeTraits<X>::from_float(v);
}

// Thread (blockIdx.x, threadIdx.x) owns pair j of head h (H * half pairs per position, consecutive threads on
// consecutive j); blockIdx.y strides over the B * T positions. The index arithmetic is one 32-bit division per
// position and one per thread (an int64 division per element would cost more than the memory traffic).
template <typename X>
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(const RopeParams p) {
  const int idx = blockIdx.x * kRopeThreads + threadIdx.x;
  if (idx >= p.H * p.half) return;
  const int h = idx / p.half, j = idx - h * p.half;
  for (int bt = blockIdx.y; bt < p.rows; bt += gridDim.y) {
    const int b = bt / p.T, t = bt - b * p.T;
    const X* x = static_cast<const X*>(p.x) + b * p.x_b + t * p.x_t + h * p.x_h;
    X* y = static_cast<X*>(p.out) + b * p.o_b + t * p.o_t + h * p.o_h;
    const int64_t tj = static_cast<int64_t>(t) * p.half + j;
    const float c = p.cos[tj], s = p.sin[tj];
    const float x1 = rope_load(x + j), x2 = rope_load(x + p.half + j);
    const float a = __fmul_rn(x1, c), bs = __fmul_rn(x2, s), e = __fmul_rn(x1, s), f = __fmul_rn(x2, c);
    float y1, y2;
    if (p.inverse) {
      y1 = __fadd_rn(a, bs);  // x1 cos + x2 sin
      y2 = __fsub_rn(f, e);   // x2 cos - x1 sin
    } else {
      y1 = __fsub_rn(a, bs);  // x1 cos - x2 sin
      y2 = __fadd_rn(e, f);   // x1 sin + x2 cos
    }
    rope_store(y + j, y1);
    rope_store(y + p.half + j, y2);
  }
}

}  // namespace pathattn::cuda
