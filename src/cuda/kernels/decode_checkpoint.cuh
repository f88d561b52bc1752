// The checkpointed cache's two extra kernels per decoding step (docs/math.md Eq. 35-37, docs/cuda.md "Decode"),
// around the split and combine kernels of kernels/decode.cuh, which read the old rows [0, ckpt) with the carried-back
// query and carry only the recent ones:
//
//   decode_carry_kernel   (before the split kernel), one block per (sequence, kv head):
//       M <- M H_t (Eq. 37; from I when nothing is pending), then q~ = M q_t for each query head of the kv head
//       (Eq. 35), into the workspace; block (b, 0) also saves ckpt[b] for this step's other kernels (or -1 when
//       the cache breaks 0 <= lengths - ckpt < P: that sequence then gets NaN and is left alone).
//   decode_refresh_kernel (after the combine kernel), one block per (sequence, kv head, split), only for sequences
//       with P tokens pending after this one: the old rows carried by M^T (Eq. 36), and ckpt[b] moved to t + 1.
//       M is not reset (other blocks are still reading it): the next carry kernel starts from I.
//
// The order on the stream is the synchronisation: the carry kernel has written M and q~ before any split block
// reads them, and every split block has read the old rows before the refresh rewrites them.
#pragma once

#include <type_traits>

#include "cuda/decode_params.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/decode.cuh"  // decode_len_before

namespace pathattn::cuda {

constexpr int kCarryThreads = 256;

// A cache element (f32 or bf16) to and from f32.
__device__ __forceinline__ float cache_to_f32(float x) { return x; }
__device__ __forceinline__ float cache_to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename KC>
__device__ __forceinline__ KC cache_from_f32(float x) {
  if constexpr (std::is_same_v<KC, float>)
    return x;
  else
    return __float2bfloat16_rn(x);
}

template <typename T, int D>
__global__ void __launch_bounds__(kCarryThreads) decode_carry_kernel(const DecodeParams p) {
  constexpr int kTPR = kCarryThreads / D;  // threads per row of M
  static_assert(kCarryThreads % D == 0 && (kTPR & (kTPR - 1)) == 0, "D must divide the block, a power-of-two share");
  __shared__ float sw[D], sv[D], smw[D];
  const int h = static_cast<int>(blockIdx.x % p.H), b = static_cast<int>(blockIdx.x / p.H), tid = threadIdx.x;
  const int64_t before = decode_len_before(p, b);
  if (before < 0 || before + p.S > p.Tmax) return;  // the call does not fit: the combine kernel writes NaN
  const int64_t t = before + p.step;  // this token's position
  const int64_t c = p.ckpt[b * p.sckpt];
  const bool valid = c >= 0 && c <= t && t - c < p.period;
  if (h == 0 && tid == 0) p.ckpt_snap[b] = valid ? static_cast<int32_t>(c) : -1;
  if (!valid) return;
  const bool fresh = c == t;  // nothing pending before this token: the stored M is stale and means I
  float* M = p.carry + (static_cast<int64_t>(b) * p.H + h) * D * D;
  const int64_t woff = b * p.sw.b + p.step * p.sw.t + h * p.sw.h;
  const float beta = p.beta[b * p.sbeta.b + p.step * p.sbeta.t + h * p.sbeta.h];
  for (int d = tid; d < D; d += kCarryThreads) sw[d] = load_w(p.w, woff + d, p.w_is_bf16);
  __syncthreads();
  // smw = beta M w (kTPR threads per row, summed by shuffles in a fixed order); M <- M - smw w^T (Eq. 37).
  const int row = tid / kTPR, part = tid % kTPR;
  float acc = 0.f;
  if (fresh) {
    acc = part == 0 ? sw[row] : 0.f;
  } else {
    for (int e = part; e < D; e += kTPR) acc = fmaf(M[row * D + e], sw[e], acc);
  }
#pragma unroll
  for (int off = kTPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (part == 0) smw[row] = beta * acc;
  __syncthreads();
  for (int i = tid; i < D * D; i += kCarryThreads) {
    const int d = i / D, e = i % D;
    M[i] = (fresh ? (d == e ? 1.f : 0.f) : M[i]) - smw[d] * sw[e];
  }
  __syncthreads();  // the block's global writes of M, visible to its own threads below
  // q~ = M q for each query head of the kv head (Eq. 35).
  for (int g = 0; g < p.group; ++g) {
    const int hq = h * p.group + g;
    const int64_t qoff = b * p.sq.b + p.step * p.sq.t + hq * p.sq.h;
    for (int d = tid; d < D; d += kCarryThreads) sv[d] = TypeTraits<T>::to_float(static_cast<const T*>(p.q)[qoff + d]);
    __syncthreads();
    float q = 0.f;
    for (int e = part; e < D; e += kTPR) q = fmaf(M[row * D + e], sv[e], q);
#pragma unroll
    for (int off = kTPR / 2; off > 0; off >>= 1) q += __shfl_xor_sync(0xffffffffu, q, off);
    if (part == 0) p.qcarried[(static_cast<int64_t>(b) * p.HQ + hq) * D + row] = q;
    __syncthreads();  // sv is reused by the next head
  }
}

// A refresh block's place, shared by both refresh kernels: (sequence b, kv head h, split) from blockIdx.x, and its
// share [r0, r1) of the old rows [0, ckpt). ok is false (the block returns at once) unless this token is the P-th
// pending one of a well-formed cache; the (b, 0, split 0) block moves ckpt[b] to t + 1 (the others read ckpt_snap).
struct RefreshBlock {
  bool ok;
  int b, h, r0, r1;
};
__device__ __forceinline__ RefreshBlock decode_refresh_block(const DecodeParams& p) {
  RefreshBlock rb{false, 0, 0, 0, 0};
  const int ns = p.num_splits;
  const int split = static_cast<int>(blockIdx.x % ns), bh = static_cast<int>(blockIdx.x / ns);
  rb.h = bh % p.H;
  rb.b = bh / p.H;
  const int64_t before = p.len_snap[rb.b];  // saved by step 0's split kernel, which ran before this one
  if (before < 0 || before + p.S > p.Tmax) return rb;
  const int64_t t = before + p.step;
  const int c = p.ckpt_snap[rb.b];
  if (c < 0 || t + 1 - c != p.period) return rb;  // a broken cache, or not P tokens pending yet
  if (rb.h == 0 && split == 0 && threadIdx.x == 0) p.ckpt[rb.b * p.sckpt] = static_cast<int32_t>(t + 1);
  rb.r0 = static_cast<int>(static_cast<int64_t>(c) * split / ns);
  rb.r1 = static_cast<int>(static_cast<int64_t>(c) * (split + 1) / ns);
  rb.ok = true;
  return rb;
}

// KC: the cache's key type (float or bf16).
template <typename KC, int D>
__global__ void __launch_bounds__(kCarryThreads) decode_refresh_kernel(const DecodeParams p) {
  constexpr int kWarps = kCarryThreads / 32, kPer = D / 32;  // a warp per row, kPer elements per lane
  extern __shared__ float smem_refresh[];
  float* sM = smem_refresh;          // [D][D]
  float* srow = sM + D * D;          // [kWarps][D]
  const RefreshBlock rb = decode_refresh_block(p);
  if (!rb.ok) return;
  const int b = rb.b, h = rb.h, r0 = rb.r0, r1 = rb.r1, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* M = p.carry + (static_cast<int64_t>(b) * p.H + h) * D * D;
  for (int i = threadIdx.x; i < D * D; i += kCarryThreads) sM[i] = M[i];
  __syncthreads();
  KC* ck = static_cast<KC*>(p.ck) + b * p.sck.b + h * p.sck.h;
  for (int j = r0 + warp; j < r1; j += kWarps) {
    KC* row = ck + static_cast<int64_t>(j) * p.sck.t;
#pragma unroll
    for (int i = 0; i < kPer; ++i) srow[warp * D + lane + 32 * i] = cache_to_f32(row[lane + 32 * i]);
    __syncwarp();
    float out[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {  // (M^T row)_e = sum_d M[d][e] row_d (Eq. 36): lanes read consecutive e
      const int e = lane + 32 * i;
      float acc = 0.f;
#pragma unroll 8
      for (int d = 0; d < D; ++d) acc = fmaf(sM[d * D + e], srow[warp * D + d], acc);
      out[i] = acc;
    }
    __syncwarp();  // srow is refilled by the warp's next row
#pragma unroll
    for (int i = 0; i < kPer; ++i) row[lane + 32 * i] = cache_from_f32<KC>(out[i]);
  }
}

template <int D>
constexpr int decode_refresh_smem_bytes() {
  return (D * D + (kCarryThreads / 32) * D) * 4;
}

}  // namespace pathattn::cuda
