// Preprocess: per (chunk, kv head) the UT factor of the chunk's Householder product, in f32 (docs/spec.md §6), and the
// chunk-local matrices the main kernel multiplies on the tensor cores (docs/math.md Eq. 10-14):
//   A = strict_lower(b W W^T),  T = (I + A)^{-1} (forward substitution),  U = T b W          (Eq. 10)
//   M = T b strict_lower(W K^T)  (intra-chunk logits, Eq. 12),  K^ = K - M^T W  (Eq. 14),  E = -U^T W  (Eq. 32)
// One CTA of 256 threads per (chunk, kv head); everything lives in shared memory as f32.
// Rows past the chunk's length are zero (W, K, beta), so every product is zero-padded to C = 64 rows.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/ut_solve.cuh"
#include "cuda/params.h"

namespace pathattn::cuda {

namespace prep_detail {
constexpr int C = kChunk;
constexpr int LC = C + 1;  // padded row length of C x C f32 tiles (odd: conflict-free column walks)

// acc[a][b] = sum_k X[(ty + 16a) * ldx + k] * Y[(tx + 16b) * ldy + k]   (C x C = X Y^T, 4x4 per thread; the first
// 16 kA rows and 16 kB columns only with kA, kB < 4: the chunked decode's short passes, kernels/decode_chunk.cuh)
template <int K, int kA = 4, int kB = 4>
__device__ __forceinline__ void tile_nt(const float* X, int ldx, const float* Y, int ldy, float (&acc)[kA][kB]) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int a = 0; a < kA; ++a)
#pragma unroll
    for (int b = 0; b < kB; ++b) acc[a][b] = 0.f;
#pragma unroll 8
  for (int k = 0; k < K; ++k) {
    float x[kA], y[kB];
#pragma unroll
    for (int a = 0; a < kA; ++a) x[a] = X[(ty + 16 * a) * ldx + k];
#pragma unroll
    for (int b = 0; b < kB; ++b) y[b] = Y[(tx + 16 * b) * ldy + k];
#pragma unroll
    for (int a = 0; a < kA; ++a)
#pragma unroll
      for (int b = 0; b < kB; ++b) acc[a][b] = fmaf(x[a], y[b], acc[a][b]);
  }
}

// out[i][j] = r_i (X Y^T)[i][j] on and below the diagonal (diag) or strictly below it, 0 elsewhere, for the C x C
// tile (r_i = row_scale[i], or 1 without row_scale). Every thread of the 256 calls it; no barrier inside.
template <int K>
__device__ __forceinline__ void tile_nt_lower(const float* X, int ldx, const float* Y, int ldy, float* out, int ldo,
                                              bool diag, const float* row_scale = nullptr) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4];
  tile_nt<K>(X, ldx, Y, ldy, acc);
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = ty + 16 * a, j = tx + 16 * b;
      const float r = row_scale ? row_scale[i] : 1.f;
      out[i * ldo + j] = (diag ? i >= j : i > j) ? r * acc[a][b] : 0.f;
    }
}

// The chunk's UT factor from W, K (f32, rows of length D + 1) and beta in shared memory: A = strict_lower(b W W^T)
// into sA, X = strict_lower(W K^T) into sX (Eq. 10, 12), T = (I + A)^{-1} into sT (Eq. 10). Starts after the
// caller's barrier over the loads, ends with a barrier; every thread of the 256 calls it.
template <int D>
__device__ __forceinline__ void chunk_ut_factor(const float* sW, const float* sK, const float* sBeta, float* sA,
                                                float* sT, float* sX) {
  tile_nt_lower<D>(sW, D + 1, sW, D + 1, sA, LC, false, sBeta);
  tile_nt_lower<D>(sW, D + 1, sK, D + 1, sX, LC, false);
  __syncthreads();
  ut_solve_f32<C>(sA, LC, sT, LC);
  __syncthreads();
}
}  // namespace prep_detail

template <typename T, int D>
__global__ void __launch_bounds__(256) prep_kernel(FwdParams p) {
  using namespace prep_detail;
  constexpr int LD = D + 1;
  extern __shared__ float smem[];
  float* sW = smem;             // [C][LD]  w rows (f32)
  float* sK = sW + C * LD;      // [C][LD]  k rows
  float* sA = sK + C * LD;      // [C][LC]  A, later M
  float* sT = sA + C * LC;      // [C][LC]  T = (I + A)^{-1}
  float* sX = sT + C * LC;      // [C][LC]  strict_lower(W K^T)
  float* sBeta = sX + C * LC;   // [C]

  const int gc = blockIdx.x, h = blockIdx.y;
  const ChunkInfo ci = p.chunks[gc];
  const int tid = threadIdx.x;
  const T* k = static_cast<const T*>(p.k);

  // Load W, K (f32) and beta; zero rows past the chunk's end.
  // All loads of a thread are issued before the first use (a fully unrolled loop of compile-time length):
  // the first version looped load -> store, and each iteration waited a full global-memory latency.
  {
    constexpr int kIters = C * D / 256;
    float wv[kIters], kv[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * 256 + tid, r = e / D, d = e % D;
      wv[it] = kv[it] = 0.f;
      if (r < ci.len) {
        const int64_t t = ci.t0 + r;
        wv[it] = load_w(p.w, ci.b * p.sw.b + t * p.sw.t + h * p.sw.h + d, p.w_is_bf16);
        kv[it] = TypeTraits<T>::to_float(k[ci.b * p.sk.b + t * p.sk.t + h * p.sk.h + d]);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * 256 + tid, r = e / D, d = e % D;
      sW[r * LD + d] = wv[it];
      sK[r * LD + d] = kv[it];
    }
  }
  for (int r = tid; r < C; r += blockDim.x)
    sBeta[r] = r < ci.len ? p.beta[ci.b * p.sbeta.b + (int64_t)(ci.t0 + r) * p.sbeta.t + h * p.sbeta.h] : 0.f;
  __syncthreads();

  chunk_ut_factor<D>(sW, sK, sBeta, sA, sT, sX);  // A, X = strict_lower(W K^T), T = (I + A)^{-1} (Eq. 10, 12)

  const int64_t base = ((int64_t)gc * p.H + h) * C;  // row index of this (chunk, head) in the workspace
  T* gU = static_cast<T*>(p.ws.u) + base * D;
  T* gW = static_cast<T*>(p.ws.w) + base * D;
  T* gK = static_cast<T*>(p.ws.khat) + base * D;
  T* gM = p.ws.m ? static_cast<T*>(p.ws.m) + base * C : nullptr;

  // U = T b W (Eq. 10), and W itself in the tensor-core dtype.
  for (int e = tid; e < C * D; e += blockDim.x) {
    const int i = e / D, d = e % D;
    float s = 0.f;
    for (int l = 0; l <= i; ++l) s = fmaf(sT[i * LC + l] * sBeta[l], sW[l * LD + d], s);
    gU[e] = TypeTraits<T>::from_float(s);
    gW[e] = TypeTraits<T>::from_float(sW[i * LD + d]);
    if (p.ws.u32) {
      p.ws.u32[base * D + e] = s;
      p.ws.w32[base * D + e] = sW[i * LD + d];
    }
  }
  __syncthreads();  // U (f32, ws.u32: this path always has the key cache's copies) is complete
  // E = -U^T W (Eq. 32): E[n][d] = -sum_i U[i][n] W[i][d].
  T* gE = static_cast<T*>(p.ws.step) + ((int64_t)gc * p.H + h) * D * D;
  for (int e = tid; e < D * D; e += blockDim.x) {
    const int n = e / D, d = e % D;
    float s = 0.f;
    for (int i = 0; i < C; ++i) s = fmaf(p.ws.u32[(base + i) * D + n], sW[i * LD + d], s);
    gE[e] = TypeTraits<T>::from_float(-s);
  }
  // M = T b X into sA (A is no longer needed) (Eq. 12). M[i][j] = sum_{j < l <= i} T[i][l] b_l X[l][j].
  for (int e = tid; e < C * C; e += blockDim.x) {
    const int i = e / C, j = e % C;
    float s = 0.f;
    for (int l = j + 1; l <= i; ++l) s = fmaf(sT[i * LC + l] * sBeta[l], sX[l * LC + j], s);
    sA[i * LC + j] = s;
    if (gM) gM[e] = TypeTraits<T>::from_float(s);  // the backward reads no M (api.cu gives none)
  }
  __syncthreads();
  // K^ = K - M^T W (Eq. 14): k^_j = k_j - sum_{i > j} M[i][j] w_i.
  for (int e = tid; e < C * D; e += blockDim.x) {
    const int j = e / D, d = e % D;
    float s = sK[j * LD + d];
    for (int i = j + 1; i < C; ++i) s = fmaf(-sA[i * LC + j], sW[i * LD + d], s);
    gK[e] = TypeTraits<T>::from_float(s);
    if (p.ws.khat32) p.ws.khat32[base * D + e] = s;
  }
}

template <int D>
constexpr int prep_smem_bytes() {
  return (2 * kChunk * (D + 1) + 3 * kChunk * (kChunk + 1) + kChunk) * 4;
}

}  // namespace pathattn::cuda
