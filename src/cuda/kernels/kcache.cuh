// The prefill key cache (docs/spec.md §4): every key carried to the end of its sequence, k_j -> H_L ... H_{j+1} k_j,
// with linear work through suffix products of chunks (docs/math.md Eq. 11, 14):
//   S_{N-1} = I,   S_{c-1} = S_c P_c = S_c - (S_c W_c^T) U_c      (P_c = I - W_c^T U_c, Eq. 11)
//   kcache_j = S_c k^_j for j in chunk c                             (k^ carried to its chunk's end, Eq. 14)
// One CTA per (sequence, kv head) walks its chunks right to left with S in shared memory (f32), so each chunk
// is visited once: O(L D^2) work per sequence, never O(L^2).
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/params.h"

namespace pathattn::cuda {

template <int D>
constexpr int kcache_smem_bytes() {
  constexpr int a = kChunk * (D + 1), b = D * (kChunk + 1);
  return (D * (D + 1) + 2 * kChunk * (D + 1) + (a > b ? a : b)) * 4;
}

template <typename T, int D>
__global__ void __launch_bounds__(256) kcache_kernel(FwdParams p) {
  constexpr int C = kChunk, LD = D + 1, LY = C + 1;
  extern __shared__ float smem[];
  float* sS = smem;               // [D][LD]   S_c
  float* sW = sS + D * LD;        // [C][LD]
  float* sU = sW + C * LD;        // [C][LD]
  float* sKY = sU + C * LD;       // [C][LD] K^_c, then [D][LY] Y = S_c W_c^T
  const int seq = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const SeqInfo si = p.seqs[seq];
  T* kc = static_cast<T*>(p.kcache);

  for (int e = tid; e < D * D; e += blockDim.x) sS[(e / D) * LD + e % D] = (e / D == e % D) ? 1.f : 0.f;
  for (int c = si.first + si.count - 1; c >= si.first; --c) {
    const ChunkInfo ci = p.chunks[c];
    const int64_t base = ((int64_t)c * p.H + h) * C * D;
    __syncthreads();  // the previous step's S update is complete; W, U, KY are free
    {  // all loads in flight before the stores (unrolled, compile-time trip count)
      constexpr int kIters = C * D / 256;
      float a[kIters], b[kIters], c2[kIters];
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int e = it * 256 + tid;
        a[it] = p.ws.w32[base + e];
        b[it] = p.ws.u32[base + e];
        c2[it] = p.ws.khat32[base + e];
      }
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int e = it * 256 + tid, r = e / D, d = e % D;
        sW[r * LD + d] = a[it];
        sU[r * LD + d] = b[it];
        sKY[r * LD + d] = c2[it];
      }
    }
    __syncthreads();
    // kcache_j[d] = sum_e S[d][e] k^_j[e]
    for (int e = tid; e < ci.len * D; e += blockDim.x) {
      const int j = e / D, d = e % D;
      float s = 0.f;
#pragma unroll 8
      for (int x = 0; x < D; ++x) s = fmaf(sS[d * LD + x], sKY[j * LD + x], s);
      kc[ci.b * p.skc.b + (int64_t)(ci.t0 + j) * p.skc.t + h * p.skc.h + d] = TypeTraits<T>::from_float(s);
    }
    if (c == si.first) break;
    __syncthreads();
    // Y = S W^T  [D][C]
    for (int e = tid; e < D * C; e += blockDim.x) {
      const int d = e / C, l = e % C;
      float s = 0.f;
#pragma unroll 8
      for (int x = 0; x < D; ++x) s = fmaf(sS[d * LD + x], sW[l * LD + x], s);
      sKY[d * LY + l] = s;
    }
    __syncthreads();
    // S -= Y U
    for (int e = tid; e < D * D; e += blockDim.x) {
      const int d = e / D, x = e % D;
      float s = sS[d * LD + x];
#pragma unroll 8
      for (int l = 0; l < C; ++l) s = fmaf(-sKY[d * LY + l], sU[l * LD + x], s);
      sS[d * LD + x] = s;
    }
  }
}

}  // namespace pathattn::cuda
