// Warp-level tile helpers of the forward kernels (fwd.cuh: mma.sync for all of a chunk pair; fwd_wgmma.cuh: the
// diagonal chunk): shared-memory tile layout, mma.sync products from ldmatrix fragments, cp.async tile loads, and
// FlashAttention's online softmax with the output epilogue. One warp owns 16 query rows; a thread holds rows
// r0 = 16 warp + g and r0 + 8 in the accumulator layout (common.cuh), the same layout wgmma uses per warp.
#pragma once

#include <cmath>

#include "cuda/kernels/common.cuh"
#include "cuda/params.h"
#include "cuda/swizzle.h"

namespace pathattn::cuda {

namespace fwd_detail {


// Element offset of (row, col) in a tile of row length ld; swizzled: the 16-byte chunk index XOR row % 8.
// kWide (the caller's columns may reach 64 or more) with ld = 64: the wgmma kernels' layout of wider tiles
// (fwd_wgmma.cuh at D = 128), 64-column sub-tiles of kChunk rows one after the other, each in the 128-byte swizzle
// (a wgmma B operand needs its rows 128 bytes apart); for col < 64 it is the plain ld = 64 tile.
template <bool kSwz, bool kWide = false>
__device__ __forceinline__ int swz(int row, int col, int ld) {
  if constexpr (kSwz) {
    if (kWide && ld == 64) return swz128<2>(row, col, kChunk);
    return row * ld + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
  } else {
    return row * ld + col;
  }
}

// A fragments (k blocks of 16) from an f32 accumulator tile [16 x 8*NT], optionally negated.
template <typename T, int NT>
__device__ __forceinline__ void to_a_frags(const float (&acc)[NT][4], uint32_t (&a)[NT / 2][4], float sign) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    a[kk][0] = TypeTraits<T>::pack(sign * acc[2 * kk][0], sign * acc[2 * kk][1]);
    a[kk][1] = TypeTraits<T>::pack(sign * acc[2 * kk][2], sign * acc[2 * kk][3]);
    a[kk][2] = TypeTraits<T>::pack(sign * acc[2 * kk + 1][0], sign * acc[2 * kk + 1][1]);
    a[kk][3] = TypeTraits<T>::pack(sign * acc[2 * kk + 1][2], sign * acc[2 * kk + 1][3]);
  }
}

// out[16 x 8*NT] (+)= A[16 x 16*KB] * B^T, with B stored [n][k] row-major (K, K^, W) at `sb`, row stride ld.
template <typename T, int NT, int KB, bool kSwz>
__device__ __forceinline__ void gemm_nt(float (&out)[NT][4], const uint32_t (&a)[KB][4], const T* sb, int ld) {
  const int lane = threadIdx.x % 32;
  const int row = (lane / 16) * 8 + lane % 8, col = ((lane / 8) % 2) * 8;
#pragma unroll
  for (int n2 = 0; n2 < NT / 2; ++n2)
#pragma unroll
    for (int kk = 0; kk < KB; ++kk) {
      uint32_t r[4];
      ldsm_x4(r, smem_addr(sb + swz<kSwz, (KB > 4)>(n2 * 16 + row, kk * 16 + col, ld)));
      mma16816<T>(out[2 * n2], a[kk], r[0], r[1]);
      mma16816<T>(out[2 * n2 + 1], a[kk], r[2], r[3]);
    }
}

// out[16 x 8*NT] += A[16 x 16*KB] * B, with B stored [k][n] row-major (V, U, M) at `sb`, row stride ld.
template <typename T, int NT, int KB, bool kSwz>
__device__ __forceinline__ void gemm_nn(float (&out)[NT][4], const uint32_t (&a)[KB][4], const T* sb, int ld) {
  const int lane = threadIdx.x % 32;
  const int row = ((lane / 8) % 2) * 8 + lane % 8, col = (lane / 16) * 8;
#pragma unroll
  for (int kk = 0; kk < KB; ++kk)
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; ++n2) {
      uint32_t r[4];
      ldsm_x4_t(r, smem_addr(sb + swz<kSwz, (NT > 8)>(kk * 16 + row, n2 * 16 + col, ld)));
      mma16816<T>(out[2 * n2], a[kk], r[0], r[1]);
      mma16816<T>(out[2 * n2 + 1], a[kk], r[2], r[3]);
    }
}

template <int NT>
__device__ __forceinline__ void zero(float (&x)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
}

// Copies a C x D tile whose rows are contiguous (workspace) or strided (inputs) into shared memory.
// Rows >= valid are zero-filled.
template <typename T, int D, bool kSwz>
__device__ __forceinline__ void load_tile(T* s, int ld, const T* g, int64_t row_stride, int valid) {
  constexpr int kPieces = D / 8;  // 16-byte pieces per row
  for (int e = threadIdx.x; e < kChunk * kPieces; e += blockDim.x) {
    const int r = e / kPieces, c = (e % kPieces) * 8;
    const bool ok = r < valid;
    cp_async16(s + swz<kSwz, (D > 64)>(r, c, ld), ok ? g + r * row_stride + c : g, ok ? 16 : 0);
  }
}

}  // namespace fwd_detail

namespace fwd_detail {

// 2^x as one MUFU.EX2, flushing results below 2^-126 to zero. exp2f without -ftz compiles to a denormal-safe
// sequence of ~4 instructions around it, and the softmax issues 2 per logit (v5 SASS: FSETP/FSEL/FMUL beside each
// MUFU); a probability under 2^-126 is zero to the bf16 product that consumes it anyway.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// FlashAttention's online softmax (base 2) for a thread's two rows: running max and sum, O rescaled per block.
struct OnlineSoftmax {
  float mx[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};

  // s: a [16 x 8*NS] block of base-2 logits, turned into unnormalised probabilities; o: [16 x 8*NO], rescaled.
  template <int NS, int NO>
  __device__ __forceinline__ void step(float (&s)[NS][4], float (&o)[NO][4]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m = mx[half];
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) m = fmaxf(m, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float alpha = fast_exp2(mx[half] - m);  // mx = -inf on the first block: alpha = 0
      mx[half] = m;
      lsum[half] *= alpha;
#pragma unroll
      for (int nt = 0; nt < NO; ++nt) {
        o[nt][2 * half] *= alpha;
        o[nt][2 * half + 1] *= alpha;
      }
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) {
        s[nt][2 * half] = fast_exp2(s[nt][2 * half] - m);
        s[nt][2 * half + 1] = fast_exp2(s[nt][2 * half + 1] - m);
        lsum[half] += s[nt][2 * half] + s[nt][2 * half + 1];
      }
    }
  }

  // O / l into o rows r0, r0 + 8 of the chunk (rows >= len skipped); lse = ln(sum exp) = (m2 + log2 l) ln 2.
  template <typename T, int NO>
  __device__ __forceinline__ void finish(const float (&o)[NO][4], T* ob, int64_t o_row_stride, float* lse,
                                         int64_t lse_row_stride, int r0, int len) {
    const int t4 = threadIdx.x % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = lsum[half];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = r0 + 8 * half;
      if (r < len) {
        const float inv = 1.f / l;
#pragma unroll
        for (int nt = 0; nt < NO; ++nt)
          *reinterpret_cast<uint32_t*>(ob + r * o_row_stride + nt * 8 + 2 * t4) =
              TypeTraits<T>::pack(o[nt][2 * half] * inv, o[nt][2 * half + 1] * inv);
        if (t4 == 0) lse[r * lse_row_stride] = (mx[half] + log2f(l)) * 0.6931471805599453f;
      }
    }
  }
};

// The query rows r0, r0 + 8 of a chunk in f32, accumulator layout [16 x D] (rows >= len are zero).
template <typename T, int NT>
__device__ __forceinline__ void load_query_rows(float (&qf)[NT][4], const T* qb, int64_t row_stride, int r0, int len) {
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + 8 * half;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float2 x = make_float2(0.f, 0.f);
      if (r < len) x = TypeTraits<T>::unpack(*reinterpret_cast<const uint32_t*>(qb + r * row_stride + nt * 8 + 2 * t4));
      qf[nt][2 * half] = x.x;
      qf[nt][2 * half + 1] = x.y;
    }
  }
}

// This CTA's work in the main kernels' schedule (launch/fwd.cu): block x = (h * NC + rank) * group + j runs
// query chunk order[rank] of query head hq = h * group + j.
struct CtaWork {
  int h, hq, gc;
};
__device__ __forceinline__ CtaWork cta_work(const FwdParams& p) {
  const int h = blockIdx.x / (p.num_chunks * p.group);
  const int rest = blockIdx.x % (p.num_chunks * p.group);
  return {h, h * p.group + rest % p.group, p.order[rest / p.group]};
}

// The gate (PaTH-FoX) of this thread's two query rows for the off-diagonal chunks: the query chunk's offset in
// f64 (docs/spec.md §6: G_i - G_j = (goff_m - goff_c) + gl_i - gl_j, the large offsets subtracted in f64) and the rows'
// cumulative gate inside the chunk (sG, in shared memory). Zero and unused without the gate.
template <bool kGate>
struct QueryGate {
  double goff = 0.0;
  float g[2] = {0.f, 0.f};
  __device__ __forceinline__ QueryGate(const FwdParams& p, int gc, int hq, const float* sG, int r0) {
    if constexpr (kGate) {
      goff = p.ws.goff[(int64_t)gc * p.HQ + hq];
      g[0] = sG[r0];
      g[1] = sG[r0 + 8];
    }
  }
};

// The diagonal chunk (Eq. 12, 13) for this warp's 16 query rows, from shared tiles K, W, U, V (C x D, row stride
// ld) and M (C x C, row stride ldm): S = lower(Q K^T) - lower(Q W^T) M, the softmax step with O += P V, and the
// query carried to the chunk start, Q^ = Q - lower(Q W^T) U (in qf). sG: the chunk's cumulative gate (kGate).
template <typename T, int D, bool kSwz, bool kGate>
__device__ __forceinline__ void diagonal_block(float (&qf)[D / 8][4], float (&o)[D / 8][4], OnlineSoftmax& sm_state,
                                               const T* sK, const T* sW, const T* sU, const T* sM, const T* sV, int ld,
                                               int ldm, const float* sG, float scale_log2, int r0) {
  constexpr int C = kChunk, NT = D / 8, KD = D / 16, NC8 = C / 8, KC = C / 16;
  constexpr float kLog2e = 1.4426950408889634f;
  const int t4 = threadIdx.x % 4;
  uint32_t qa[KD][4];
  to_a_frags<T, NT>(qf, qa, 1.f);
  float s[NC8][4], x[NC8][4];
  zero(s);
  zero(x);
  gemm_nt<T, NC8, KD, kSwz>(s, qa, sK, ld);  // Q K^T
  gemm_nt<T, NC8, KD, kSwz>(x, qa, sW, ld);  // Q W^T
  // lower(): keep key j <= query i.
#pragma unroll
  for (int nt = 0; nt < NC8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r0 + 8 * (e / 2), j = nt * 8 + 2 * t4 + e % 2;
      if (j > i) x[nt][e] = 0.f;
    }
  uint32_t xa[KC][4];
  to_a_frags<T, NC8>(x, xa, -1.f);
  gemm_nn<T, NC8, KC, kSwz>(s, xa, sM, ldm);  // S -= lower(Q W^T) M
  gemm_nn<T, NT, KC, kSwz>(qf, xa, sU, ld);   // Q^ = Q - lower(Q W^T) U
#pragma unroll
  for (int nt = 0; nt < NC8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r0 + 8 * (e / 2), j = nt * 8 + 2 * t4 + e % 2;
      float l = s[nt][e] * scale_log2;
      if constexpr (kGate) l += (sG[i] - sG[j]) * kLog2e;
      s[nt][e] = j <= i ? l : -INFINITY;
    }
  sm_state.step(s, o);
  uint32_t pa[KC][4];
  to_a_frags<T, NC8>(s, pa, 1.f);
  gemm_nn<T, NT, KC, kSwz>(o, pa, sV, ld);
}

}  // namespace fwd_detail

}  // namespace pathattn::cuda
