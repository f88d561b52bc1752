// TF32 tensor-core primitives (mma.sync m16n8k8, f32 accumulation): rounding to TF32 and the 3xTF32 split that
// keeps ~f32 accuracy (a b ~ hi hi + hi lo + lo hi). Used by the UT preprocess (prep_tc.cuh) and the chunk-local
// backward (bwd_local.cuh). Fragment layout of m16n8k8 (PTX ISA): lane = 4 g + t;
//   A 16x8: a0 = (g, t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4)
//   B 8x8:  b0 = (k t, n g), b1 = (k t + 4, n g);   C 16x8: c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1)
#pragma once

#include <cstdint>

namespace pathattn::cuda {

__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float tf32(float x) { return __uint_as_float(tf32_bits(x)); }

// Zeroes NT accumulators of m16n8 tiles.
template <int NT>
__device__ __forceinline__ void zero_acc(float (&x)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
}

// d += a b, m16n8k8, TF32 operands, f32 accumulation.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a b for f32 operands not yet rounded: 3xTF32 (small terms first; ~f32 accuracy) or plain TF32.
template <bool k3x>
__device__ __forceinline__ void mma_f32_split(float (&d)[4], const float (&a)[4], float b0, float b1) {
  uint32_t ah[4], al[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    ah[i] = tf32_bits(a[i]);
    al[i] = tf32_bits(a[i] - __uint_as_float(ah[i]));
  }
  const uint32_t bh0 = tf32_bits(b0), bh1 = tf32_bits(b1);
  if constexpr (k3x) {
    mma_tf32(d, al, bh0, bh1);
    mma_tf32(d, ah, tf32_bits(b0 - __uint_as_float(bh0)), tf32_bits(b1 - __uint_as_float(bh1)));
  }
  mma_tf32(d, ah, bh0, bh1);
}

// 3xTF32 with A already split into TF32 hi / lo parts (split once, reused across a row of n tiles). An operand
// whose values are exact in TF32 (converted from bf16 or f16: 8 or 11 significant bits against TF32's 11) has no
// low part, so its cross term is skipped: 2 products instead of 3, or 1 when both are exact.
template <bool kAExact, bool kBExact>
__device__ __forceinline__ void mma_split_a(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], float b0,
                                            float b1) {
  const uint32_t bh0 = kBExact ? __float_as_uint(b0) : tf32_bits(b0), bh1 = kBExact ? __float_as_uint(b1) : tf32_bits(b1);
  if constexpr (!kAExact) mma_tf32(d, al, bh0, bh1);
  if constexpr (!kBExact) mma_tf32(d, ah, tf32_bits(b0 - __uint_as_float(bh0)), tf32_bits(b1 - __uint_as_float(bh1)));
  mma_tf32(d, ah, bh0, bh1);
}

}  // namespace pathattn::cuda
