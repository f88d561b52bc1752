// The fused short convolution of the PaTH layer's w (docs/math.md Eq. 44-46; the CPU statement is
// src/cpu/short_conv.cpp): causal depthwise conv over time, SiLU, L2 normalisation per head, and its backward.
// Element-wise work: what matters is one pass over u and w instead of the torch composition's ~20.
//   forward:  one warp per (row, head); lane l holds channels l, l + 32, ... (NPL = ceil(D / 32) of them), the
//             head's norm by a warp reduction.
//   backward: one CTA per (64-row tile, head, batch row): dy for the tile's rows and the K - 1 after it (each
//             output row's dy needs u's rows t - K + 1 .. t, recomputed as the forward does) into shared memory,
//             then du and dstate from the tile's dy, and the tile's weight-gradient partial sums in a fixed order;
//             a second kernel adds the partials over the tiles in tile order (the same bits on every run).
// short_conv_vec.cuh: the vector form (8 channels and a run of rows per thread), opt-in until measured.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace pathattn::cuda {

constexpr int kConvMaxK = 8;         // the largest kernel size (ConvProblem checks it)
constexpr int kConvThreads = 256;    // both kernels
constexpr int kConvRowsFwd = kConvThreads / 32;  // forward rows per CTA (one per warp)
constexpr int kConvTile = 64;        // backward rows per CTA

struct ShortConvParams {
  const void* u;       // [B, T, C]
  int64_t u_b, u_t, u_c;
  const void* weight;  // [C, K]
  int64_t wt_c, wt_k;
  const void* state;   // [B, K - 1, C] or null
  int64_t st_b, st_t, st_c;
  const int32_t* cu;   // [num_seqs + 1] or null
  int64_t cu_stride;
  int num_seqs;
  float* w;            // forward output [B, T, H, D]
  const float* dw;     // backward input, same shape
  int64_t w_b, w_t, w_h, w_d, dw_b, dw_t, dw_h, dw_d;
  void* du;            // [B, T, C]
  int64_t du_b, du_t, du_c;
  void* dstate;        // [B, K - 1, C] or null
  int64_t ds_b, ds_t, ds_c;
  float* partial;      // [B * tiles, C, K] scratch
  float* dweight;      // [C, K]
  int64_t dwt_c, dwt_k;
  int B, T, C, K, H, D, tiles;
  float eps;
};

__device__ __forceinline__ float conv_to_f32(float x) { return x; }
__device__ __forceinline__ float conv_to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float conv_to_f32(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T conv_from_f32(float x);
template <>
__device__ __forceinline__ float conv_from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 conv_from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half conv_from_f32<__half>(float x) { return __float2half_rn(x); }

// The first row of row t's sequence: 0, or the largest cu[i] <= t (varlen; empty sequences share a start).
__device__ __forceinline__ int conv_seq_start(const ShortConvParams& p, int t) {
  if (p.cu == nullptr) return 0;
  int lo = 0, hi = p.num_seqs;  // cu[lo] <= t < cu[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.cu[mid * p.cu_stride] <= t) lo = mid; else hi = mid;
  }
  return p.cu[lo * p.cu_stride];
}

// The convolution's input at position s for an output row whose sequence starts at `start` (Eq. 44).
template <typename U>
__device__ __forceinline__ float conv_input(const ShortConvParams& p, int b, int s, int start, int c) {
  const U* u = static_cast<const U*>(p.u);
  const U* st = static_cast<const U*>(p.state);
  if (s >= start) return conv_to_f32(u[b * p.u_b + s * p.u_t + c * p.u_c]);
  if (st != nullptr && s < 0) return conv_to_f32(st[b * p.st_b + (p.K - 1 + s) * p.st_t + c * p.st_c]);
  return 0.f;
}

template <typename Wt>
__device__ __forceinline__ float conv_weight(const ShortConvParams& p, int c, int j) {
  return conv_to_f32(static_cast<const Wt*>(p.weight)[c * p.wt_c + j * p.wt_k]);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// y and silu(y) of the lane's channels of row t, head h, and the head's norm max(|a|, eps) (Eq. 44-45); returns
// |a| (unclamped) in *norm.
template <typename U, typename Wt, int NPL>
__device__ __forceinline__ float conv_row(const ShortConvParams& p, int b, int t, int h, float (&y)[NPL],
                                          float (&a)[NPL], float* norm) {
  const int lane = threadIdx.x % 32, start = conv_seq_start(p, t);
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int d = lane + 32 * i, c = h * p.D + d;
    float acc = 0.f;
    if (d < p.D)
      for (int j = 0; j < p.K; ++j) acc = fmaf(conv_weight<Wt>(p, c, j), conv_input<U>(p, b, t - p.K + 1 + j, start, c), acc);
    y[i] = acc;
    a[i] = acc / (1.f + __expf(-acc));  // silu
    ss = fmaf(a[i], a[i], ss);
  }
  *norm = sqrtf(warp_sum(ss));
  return fmaxf(*norm, p.eps);
}

template <typename U, typename Wt, int NPL>
__global__ void __launch_bounds__(kConvThreads) short_conv_w_fwd_kernel(ShortConvParams p) {
  const int t = blockIdx.x * kConvRowsFwd + threadIdx.x / 32, h = blockIdx.y, b = blockIdx.z;
  if (t >= p.T) return;  // warp-uniform
  float y[NPL], a[NPL], norm;
  const float n = conv_row<U, Wt, NPL>(p, b, t, h, y, a, &norm);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int d = lane + 32 * i;
    if (d < p.D) p.w[b * p.w_b + t * p.w_t + h * p.w_h + d * p.w_d] = a[i] / n;
  }
}

// Shared memory of the backward CTA: dy [kConvTile + K - 1][D] f32, the rows' sequence starts, and the weight
// partials of the thread groups [groups][D][K].
__host__ __device__ inline int conv_bwd_smem_bytes(int D, int K) {
  const int groups = kConvThreads / D;
  return (kConvTile + K - 1) * D * 4 + (kConvTile + K - 1) * 4 + groups * D * K * 4;
}

template <typename U, typename Wt, int NPL>
__global__ void __launch_bounds__(kConvThreads) short_conv_w_bwd_kernel(ShortConvParams p) {
  extern __shared__ float smem[];
  const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t0 = tile * kConvTile, K = p.K, D = p.D;
  const int rows = kConvTile + K - 1;
  float* dy_s = smem;                                           // [rows][D]
  int* start_s = reinterpret_cast<int*>(smem + rows * D);       // [rows]
  float* red_s = smem + rows * D + rows;                        // [groups][D][K]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // 1. dy of rows t0 .. t0 + rows - 1 (zero past T), Eq. 46.
  for (int r = warp; r < rows; r += kConvThreads / 32) {
    const int t = t0 + r;
    if (t >= p.T) {
      for (int d = lane; d < D; d += 32) dy_s[r * D + d] = 0.f;
      if (lane == 0) start_s[r] = p.T;
      continue;
    }
    float y[NPL], a[NPL], norm;
    const float n = conv_row<U, Wt, NPL>(p, b, t, h, y, a, &norm);
    float g[NPL], wdw = 0.f;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int d = lane + 32 * i;
      g[i] = d < D ? p.dw[b * p.dw_b + t * p.dw_t + h * p.dw_h + d * p.dw_d] : 0.f;
      wdw = fmaf(a[i] / n, g[i], wdw);
    }
    wdw = warp_sum(wdw);
    const bool clamped = !(norm >= p.eps);
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int d = lane + 32 * i;
      if (d >= D) continue;
      const float da = clamped ? g[i] / p.eps : (g[i] - a[i] / n * wdw) / n;
      const float s = 1.f / (1.f + __expf(-y[i]));
      dy_s[r * D + d] = da * s * (1.f + y[i] * (1.f - s));
    }
    if (lane == 0) start_s[r] = conv_seq_start(p, t);
  }
  __syncthreads();

  // 2. du (and dstate for the first tile) of the tile's rows, and the weight partials; thread = (group, channel).
  const int groups = kConvThreads / D, grp = threadIdx.x / D, d = threadIdx.x % D, c = h * D + d;
  float acc_w[kConvMaxK], wt[kConvMaxK];  // this channel's weight partials and taps
#pragma unroll
  for (int j = 0; j < kConvMaxK; ++j) {
    acc_w[j] = 0.f;
    wt[j] = grp < groups && j < K ? conv_weight<Wt>(p, c, j) : 0.f;
  }
  if (grp < groups) {
    auto row = [&](int s) {  // du (or dstate) of position s, and row s's weight partials
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < kConvMaxK; ++j) {
        const int t = s + K - 1 - j;  // the output row that reads position s with tap j
        if (j >= K || t < 0 || t >= p.T || (s >= 0 && start_s[t - t0] > s)) continue;  // s < 0: the state
        acc = fmaf(wt[j], dy_s[(t - t0) * D + d], acc);
      }
      if (s >= 0) {
        static_cast<U*>(p.du)[b * p.du_b + s * p.du_t + c * p.du_c] = conv_from_f32<U>(acc);
        // dweight[c, j] += dy[s, c] x(s - K + 1 + j): row s's own taps.
        const float g = dy_s[(s - t0) * D + d];
        const int start = start_s[s - t0];
#pragma unroll
        for (int j = 0; j < kConvMaxK; ++j)
          if (j < K) acc_w[j] = fmaf(g, conv_input<U>(p, b, s - K + 1 + j, start, c), acc_w[j]);
      } else {
        static_cast<U*>(p.dstate)[b * p.ds_b + (K - 1 + s) * p.ds_t + c * p.ds_c] = conv_from_f32<U>(acc);
      }
    };
    // The state's positions s < 0 (first tile, when dstate is asked for) apart from the tile's rows, so that the
    // rows' assignment to groups, and with it the order of the weight sums, is the same either way.
    if (tile == 0 && p.dstate != nullptr)
      for (int s = -(K - 1) + grp; s < 0; s += groups) row(s);
    for (int s = t0 + grp; s < min(t0 + kConvTile, p.T); s += groups) row(s);
#pragma unroll
    for (int j = 0; j < kConvMaxK; ++j)
      if (j < K) red_s[(grp * D + d) * K + j] = acc_w[j];
  }
  __syncthreads();
  // The groups' partials added in group order, one [D, K] block per CTA.
  for (int i = threadIdx.x; i < D * K; i += kConvThreads) {
    float sum = 0.f;
    for (int gi = 0; gi < groups; ++gi) sum += red_s[gi * D * K + i];
    const int dd = i / K, j = i % K;
    p.partial[(static_cast<int64_t>(b) * p.tiles + tile) * p.C * K + (h * D + dd) * K + j] = sum;
  }
}

// dweight[c, j] = the partials summed over (batch row, tile) in that order.
__global__ void __launch_bounds__(kConvThreads) short_conv_w_dweight_kernel(ShortConvParams p) {
  const int i = blockIdx.x * kConvThreads + threadIdx.x, n = p.C * p.K;
  if (i >= n) return;
  float sum = 0.f;
  const int64_t parts = static_cast<int64_t>(p.B) * p.tiles;
  for (int64_t q = 0; q < parts; ++q) sum += p.partial[q * n + i];
  p.dweight[(i / p.K) * p.dwt_c + (i % p.K) * p.dwt_k] = sum;
}

}  // namespace pathattn::cuda
