// Preprocess on the tensor cores (the forward without kcache): the same quantities as prep.cuh (docs/math.md
// Eq. 10-14), with the five C x C x D products as TF32 mma.sync (m16n8k8, f32 accumulation) and the triangular
// solve in plain f32 on the CUDA cores, blocked in 16 x 16 tiles so that its dependency chain is 16 steps, not 64.
//
// Why: the all-f32 CUDA-core version (prep.cuh) took 18 ms of a 39 ms forward at B x T = 32 x 4096, H = 32,
// D = 64 on the H200 (docs/perf/notes.md): its per-element dot products were shared-memory bound. TF32 products
// (10-bit mantissa, like fla's tl.dot on f32 inputs) feed factors that are stored in bf16/f16 anyway.
//
// One CTA of 4 warps per (chunk, kv head); warp w computes rows 16w..16w+15 of each product.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/params.h"

namespace pathattn::cuda {

namespace prep_tc_detail {
constexpr int C = kChunk;
constexpr int LS = C + 8;  // f32 row stride of C x C tiles: 8 (mod 32) keeps both fragment patterns
                           // (g * LS + t and t * LS + g, g < 8, t < 4) on distinct banks

__device__ __forceinline__ uint32_t tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// acc[16 x 8*NT] += A[16 x K] B[K x 8*NT] with A(i, k) = a(i, k), B(k, n) = b(k, n) read from shared memory.
template <int NT, int K, typename FA, typename FB>
__device__ __forceinline__ void warp_mma_tf32(float (&acc)[NT][4], FA a, FB b) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    const uint32_t a0 = tf32(a(g, k0 + t)), a1 = tf32(a(g + 8, k0 + t)), a2 = tf32(a(g, k0 + t + 4)),
                   a3 = tf32(a(g + 8, k0 + t + 4));
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint32_t b0 = tf32(b(k0 + t, nt * 8 + g)), b1 = tf32(b(k0 + t + 4, nt * 8 + g));
      asm volatile(
          "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(acc[nt][0]), "+f"(acc[nt][1]), "+f"(acc[nt][2]), "+f"(acc[nt][3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero_acc(float (&x)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
}
}  // namespace prep_tc_detail

template <int D>
constexpr int prep_tc_smem_bytes() {
  return (2 * kChunk * (D + 8) + 3 * kChunk * prep_tc_detail::LS + 3 * 16 * 16 + kChunk) * 4;
}

template <typename T, int D>
__global__ void __launch_bounds__(128) prep_tc_kernel(Params p) {
  using namespace prep_tc_detail;
  constexpr int LW = D + 8;
  constexpr int NTD = D / 8, NTC = C / 8;
  extern __shared__ float smem[];
  float* sW = smem;            // [C][LW]  w rows
  float* sK = sW + C * LW;     // [C][LW]  k rows
  float* sA = sK + C * LW;     // [C][LS]  A = strict_lower(b W W^T), later M
  float* sT = sA + C * LS;     // [C][LS]  T = (I + A)^{-1}, later T b
  float* sX = sT + C * LS;     // [C][LS]  strict_lower(W K^T)
  float* sY = sX + C * LS;     // [3][16][16] scratch of the blocked solve
  float* sBeta = sY + 3 * 256; // [C]

  const int gc = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int rw = warp * 16;  // this warp's first row
  const ChunkInfo ci = p.chunks[gc];
  const T* k = static_cast<const T*>(p.k);

  // All loads of a thread are issued before the first use (a fully unrolled loop of compile-time length):
  // the first version looped load -> store, and each iteration waited a full global-memory latency.
  {
    constexpr int kIters = C * D / 128;
    float wv[kIters], kv[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * 128 + tid, r = e / D, d = e % D;
      wv[it] = kv[it] = 0.f;
      if (r < ci.len) {
        const int64_t t = ci.t0 + r;
        wv[it] = load_w(p.w, ci.b * p.sw.b + t * p.sw.t + h * p.sw.h + d, p.w_is_bf16);
        kv[it] = TypeTraits<T>::to_float(k[ci.b * p.sk.b + t * p.sk.t + h * p.sk.h + d]);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * 128 + tid, r = e / D, d = e % D;
      sW[r * LW + d] = wv[it];
      sK[r * LW + d] = kv[it];
    }
  }
#pragma unroll
  for (int e = tid; e < C * LS; e += 128) sT[e] = 0.f;
  for (int r = tid; r < C; r += blockDim.x)
    sBeta[r] = r < ci.len ? p.beta[ci.b * p.sbeta.b + (int64_t)(ci.t0 + r) * p.sbeta.t + h * p.sbeta.h] : 0.f;
  __syncthreads();

  // A = strict_lower(b W W^T), X = strict_lower(W K^T)   (Eq. 10, 12)
  {
    float acc[NTC][4];
    zero_acc(acc);
    warp_mma_tf32<NTC, D>(acc, [&](int i, int kk) { return sW[(rw + i) * LW + kk]; },
                          [&](int kk, int n) { return sW[n * LW + kk]; });
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = rw + g + 8 * (e / 2), j = nt * 8 + 2 * t4 + e % 2;
        sA[i * LS + j] = i > j ? sBeta[i] * acc[nt][e] : 0.f;
      }
    zero_acc(acc);
    warp_mma_tf32<NTC, D>(acc, [&](int i, int kk) { return sW[(rw + i) * LW + kk]; },
                          [&](int kk, int n) { return sK[n * LW + kk]; });
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = rw + g + 8 * (e / 2), j = nt * 8 + 2 * t4 + e % 2;
        sX[i * LS + j] = i > j ? acc[nt][e] : 0.f;
      }
  }
  __syncthreads();

  // T = (I + A)^{-1}, blocked: the four 16 x 16 diagonal blocks by forward substitution (one column per thread),
  // then block row by block row T_bj = -T_bb sum_{j <= k < b} A_bk T_kj.
  // Every loop below has compile-time bounds and is unrolled (predicated instead of variable bounds), so that
  // the shared-memory loads of a dependency chain are issued ahead of its FMAs: the first version's variable-bound
  // loops made this solve a chain of load-latency steps (measured: the preprocess took 9.5 ms at 32 x 4096).
  if (tid < C) {
    const int b0 = (tid / 16) * 16, c = tid % 16;
    float col[16];  // column c of the diagonal block, in registers
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float s = 0.f;
#pragma unroll
      for (int l = 0; l < i; ++l) s = fmaf(sA[(b0 + i) * LS + b0 + l], col[l], s);
      col[i] = i < c ? 0.f : (i == c ? 1.f : -s);  // rows above c: col[l] = 0 there, so the sum starts at c
      sT[(b0 + i) * LS + b0 + c] = col[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int bi = 1; bi < 4; ++bi) {
#pragma unroll
    for (int it = 0; it < 2 * bi; ++it) {  // bi * 256 entries of Y over 128 threads
      const int e = it * 128 + tid, j = e / 256, r = (e % 256) / 16, c = e % 16;
      float s = 0.f;
#pragma unroll
      for (int kb = 0; kb < bi; ++kb)
        if (kb >= j) {
#pragma unroll
          for (int l = 0; l < 16; ++l) s = fmaf(sA[(16 * bi + r) * LS + 16 * kb + l], sT[(16 * kb + l) * LS + 16 * j + c], s);
        }
      sY[e] = s;
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < 2 * bi; ++it) {
      const int e = it * 128 + tid, j = e / 256, r = (e % 256) / 16, c = e % 16;
      float s = 0.f;
#pragma unroll
      for (int l = 0; l < 16; ++l) s = fmaf(sT[(16 * bi + r) * LS + 16 * bi + l], sY[j * 256 + l * 16 + c], s);
      sT[(16 * bi + r) * LS + 16 * j + c] = -s;
    }
    __syncthreads();
  }
  // T b: scale column l by beta_l (both U and M use T b).
#pragma unroll
  for (int e = tid; e < C * C; e += 128) sT[(e / C) * LS + e % C] *= sBeta[e % C];
  __syncthreads();

  const int64_t base = ((int64_t)gc * p.H + h) * C;
  T* gU = static_cast<T*>(p.ws.u) + base * D;
  T* gW = static_cast<T*>(p.ws.w) + base * D;
  T* gK = static_cast<T*>(p.ws.khat) + base * D;
  T* gM = static_cast<T*>(p.ws.m) + base * C;
  auto store2 = [](T* dst, float lo, float hi) { *reinterpret_cast<uint32_t*>(dst) = TypeTraits<T>::pack(lo, hi); };

#pragma unroll
  for (int e = tid; e < C * D / 2; e += 128) {
    const int r = (2 * e) / D, d = (2 * e) % D;
    store2(gW + r * D + d, sW[r * LW + d], sW[r * LW + d + 1]);
  }
  // U = (T b) W   (Eq. 10)
  {
    float acc[NTD][4];
    zero_acc(acc);
    warp_mma_tf32<NTD, C>(acc, [&](int i, int kk) { return sT[(rw + i) * LS + kk]; },
                          [&](int kk, int n) { return sW[kk * LW + n]; });
#pragma unroll
    for (int nt = 0; nt < NTD; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        store2(gU + (rw + g + 8 * half) * D + nt * 8 + 2 * t4, acc[nt][2 * half], acc[nt][2 * half + 1]);
  }
  // M = (T b) X into sA (A is dead after the solve)   (Eq. 12)
  {
    float acc[NTC][4];
    zero_acc(acc);
    warp_mma_tf32<NTC, C>(acc, [&](int i, int kk) { return sT[(rw + i) * LS + kk]; },
                          [&](int kk, int n) { return sX[kk * LS + n]; });
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = rw + g + 8 * half, j = nt * 8 + 2 * t4;
        sA[i * LS + j] = acc[nt][2 * half];
        sA[i * LS + j + 1] = acc[nt][2 * half + 1];
        store2(gM + i * C + j, acc[nt][2 * half], acc[nt][2 * half + 1]);
      }
  }
  __syncthreads();
  // K^ = K - M^T W   (Eq. 14); row j of K^ needs column j of M.
  {
    float acc[NTD][4];
    zero_acc(acc);
    warp_mma_tf32<NTD, C>(acc, [&](int j, int i) { return sA[i * LS + rw + j]; },
                          [&](int i, int n) { return sW[i * LW + n]; });
#pragma unroll
    for (int nt = 0; nt < NTD; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = rw + g + 8 * half, d = nt * 8 + 2 * t4;
        store2(gK + j * D + d, sK[j * LW + d] - acc[nt][2 * half], sK[j * LW + d + 1] - acc[nt][2 * half + 1]);
      }
  }
}

}  // namespace pathattn::cuda
