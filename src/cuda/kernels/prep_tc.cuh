// Preprocess on the tensor cores (the forward without kcache): the same quantities as prep.cuh (docs/math.md
// Eq. 10-14), with the C x C x D products as TF32 mma.sync (m16n8k8, f32 accumulation) and the triangular solve
// blocked in 16 x 16 tiles: diagonal blocks by f32 forward substitution, the blocks below them as 16 x 16 x 16
// tensor-core products in 3xTF32 (split operands, ~f32 accuracy).
//
// Why: the all-f32 CUDA-core version (prep.cuh) took 18 ms of a 39 ms forward at B x T = 32 x 4096, H = 32,
// D = 64 on the H200 (docs/perf/notes.md): its per-element dot products were shared-memory bound. TF32 products
// (10-bit mantissa, like fla's tl.dot on f32 inputs) feed factors that are stored in bf16/f16 anyway.
//
// One CTA of 4 warps per (chunk, kv head); warp w computes rows 16w..16w+15 of each product.
//
// v6: ncu on v5 (6.1 ms at 32 x 4096, D = 64): 67.8 KB per CTA (3 CTAs/SM), issue IPC 1.38, 65% of cycles with
// no eligible warp, L1TEX (shared load) scoreboard stalls; ~5k warp instructions per warp, ~1.9k of them the
// solve's scalar LDS + FFMA chains. Now:
//  * the solve's off-diagonal blocks are mma products (recursive 2 x 2 form, no scratch), done in place in the
//    tile that held A, and the diagonal substitution reads A rows as float4;
//  * shared memory 54 KB at D = 64 (4 CTAs/SM; 70 KB, 3 CTAs/SM at D = 128, was 2): three tiles. K sits in the
//    tile that later holds A and T (X is formed first and K^ reloads its K from L2), X, then M^T, then U share
//    the second, W has the third;
//  * 16-byte global loads of W and K and 16-byte stores of W when the pointers and strides allow (scalar otherwise);
//  * fewer shared-memory instructions per mma. The k order inside an mma is free as long as A and B agree: where
//    both operands are stored along k (A = W W^T and X^T = K W^T, one loop sharing the W loads; M = T b X with X
//    stored transposed), lane t takes the adjacent k0 + 2t, k0 + 2t + 1 (8-byte loads). The n order is free too:
//    where B is stored along n (U, K^, E: B = W), n tiles go in pairs over even / odd columns (one 8-byte load for
//    two tiles), and each lane ends with 4 adjacent columns (8-byte global stores).
// It also forms E = -U^T W (Eq. 32), the main kernel's per-chunk query step.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/tf32.cuh"
#include "cuda/kernels/ut_solve.cuh"
#include "cuda/params.h"

#include <type_traits>

namespace pathattn::cuda {

namespace prep_tc_detail {
constexpr int C = kChunk;
constexpr int LS = C + 8;  // f32 row stride of C x C tiles: 8 (mod 32) keeps both fragment patterns
                           // (g * LS + t and t * LS + g, g < 8, t < 4) and the 8-byte pair pattern
                           // (g * LS + 2t) on distinct banks

using cuda::mma_tf32;  // tf32.cuh: the shared TF32 primitives
using cuda::zero_acc;
using cuda::tf32;
using cuda::tf32_bits;

// Warp products acc[16 x 8*NT] += A[16 x K] B[K x 8*NT] on values already TF32-exact (rounded when stored, or
// bf16/f16 inputs), so fragments are plain shared-memory loads.
//
// Both operands stored along k: a2(i, k) = {A(i, k), A(i, k + 1)}, b2(k, n) = {B(k, n), B(k + 1, n)}
// for even k. The mma sums over its 8 k slots in any order as long as A and B agree, so lane t takes the adjacent
// k0 + 2t, k0 + 2t + 1 as slots t, t + 4 (not k0 + t, k0 + t + 4): one 8-byte load per pair instead of two.
template <int NT, int K, typename FA, typename FB>
__device__ __forceinline__ void warp_mma_tf32_pairs(float (&acc)[NT][4], FA a2, FB b2) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    const float2 r0 = a2(g, k0 + 2 * t), r1 = a2(g + 8, k0 + 2 * t);
    const uint32_t af[4] = {__float_as_uint(r0.x), __float_as_uint(r1.x), __float_as_uint(r0.y),
                            __float_as_uint(r1.y)};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float2 bb = b2(k0 + 2 * t, nt * 8 + g);
      mma_tf32(acc[nt], af, __float_as_uint(bb.x), __float_as_uint(bb.y));
    }
  }
}

// Two products with the same B in the pair k order: acc1 += A1 B, acc2 += A2 B (one B load for both).
template <int NT, int K, typename FA1, typename FA2, typename FB>
__device__ __forceinline__ void warp_mma_tf32_pairs2(float (&acc1)[NT][4], float (&acc2)[NT][4], FA1 a1, FA2 a2,
                                                     FB b2) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll 1
  for (int k0 = 0; k0 < K; k0 += 8) {
    const float2 r0 = a1(g, k0 + 2 * t), r1 = a1(g + 8, k0 + 2 * t);
    const float2 q0 = a2(g, k0 + 2 * t), q1 = a2(g + 8, k0 + 2 * t);
    const uint32_t f1[4] = {__float_as_uint(r0.x), __float_as_uint(r1.x), __float_as_uint(r0.y),
                            __float_as_uint(r1.y)};
    const uint32_t f2[4] = {__float_as_uint(q0.x), __float_as_uint(q1.x), __float_as_uint(q0.y),
                            __float_as_uint(q1.y)};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float2 bb = b2(k0 + 2 * t, nt * 8 + g);
      mma_tf32(acc1[nt], f1, __float_as_uint(bb.x), __float_as_uint(bb.y));
      mma_tf32(acc2[nt], f2, __float_as_uint(bb.x), __float_as_uint(bb.y));
    }
  }
}

// A(i, k) = a(i, k) in the standard k order (lane t: k0 + t, k0 + t + 4), B stored along n, two n tiles at a time:
// the column order inside a product is also free, so n tiles 2p and 2p + 1 take the even and the odd columns of
// columns 16p..16p + 15 and b2(k, n) = {B(k, n), B(k, n + 1)} (n even) is one 8-byte load for both. Lane (g, t)
// then holds columns 16p + 4t .. 16p + 4t + 3 of rows g and g + 8: see quad().
template <int NT, int K, typename FA, typename FB>
__device__ __forceinline__ void warp_mma_tf32_npairs(float (&acc)[NT][4], FA a, FB b2) {
  static_assert(NT % 2 == 0, "n tiles go in pairs");
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    const uint32_t af[4] = {__float_as_uint(a(g, k0 + t)), __float_as_uint(a(g + 8, k0 + t)),
                            __float_as_uint(a(g, k0 + t + 4)), __float_as_uint(a(g + 8, k0 + t + 4))};
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const float2 lo = b2(k0 + t, 16 * np + 2 * g), hi = b2(k0 + t + 4, 16 * np + 2 * g);
      mma_tf32(acc[2 * np], af, __float_as_uint(lo.x), __float_as_uint(hi.x));
      mma_tf32(acc[2 * np + 1], af, __float_as_uint(lo.y), __float_as_uint(hi.y));
    }
  }
}

// Columns 16p + 4t .. 16p + 4t + 3 of row g + 8h of a warp_mma_tf32_npairs result.
template <int NT>
__device__ __forceinline__ float4 quad(const float (&acc)[NT][4], int p, int h) {
  return make_float4(acc[2 * p][2 * h], acc[2 * p + 1][2 * h], acc[2 * p][2 * h + 1], acc[2 * p + 1][2 * h + 1]);
}

}  // namespace prep_tc_detail

// Shared memory of prep_tc_kernel (floats unless noted). Three tiles and beta:
//   sW [C][LW]  W (TF32)
//   sX [C][LS]  X^T (TF32), then M^T (TF32), then U (TF32, row stride LW; at D = 128 it runs on into sT)
//   sT [C][LS]  K (input dtype, row stride LK), then A, T (in place), T b (TF32)
template <typename T, int D>
struct PrepTcSmem {
  static constexpr int C = kChunk, LS = prep_tc_detail::LS;
  static constexpr int LW = D + 8;  // sW row stride (f32) and of U
  static constexpr int LK = D + 8;  // K row stride (elements of T)
  static constexpr int kW = C * LW;
  static constexpr int kX = C * LS;
  static constexpr int kT = C * LS;
  static constexpr int kBytes = (kW + kX + kT + C) * 4;
  static_assert(C * LK * (int)sizeof(T) <= kT * 4, "K must fit in the tile of A / T");
  static_assert(C * LW <= kX + kT, "U must fit in the tiles of X and T");
};

template <typename T, int D>
__global__ void __launch_bounds__(128, D == 64 ? 4 : 3) prep_tc_kernel(FwdParams p) {
  using namespace prep_tc_detail;
  using SM = PrepTcSmem<T, D>;
  constexpr int LW = SM::LW, LK = SM::LK;
  constexpr int NTD = D / 8, NTC = C / 8;
  extern __shared__ float smem[];  // dynamic shared memory starts 16-byte aligned (float4 and uint4 accesses)
  float* sW = smem;
  float* sX = sW + SM::kW;
  float* sT = sX + SM::kX;
  T* sK = reinterpret_cast<T*>(sT);
  float* sU = sX;
  float* sBeta = sT + SM::kT;

  const int gc = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int rw = warp * 16;  // this warp's first row
  const ChunkInfo ci = p.chunks[gc];
  const uint16_t* k16 = static_cast<const uint16_t*>(p.k);  // K as raw 16-bit patterns

  // This CTA's tile of a workspace output of n elements per (chunk, head), formed where it is written (fewer
  // registers live across the solve).
  auto ws_tile = [&](void* ws, int n) { return static_cast<T*>(ws) + ((int64_t)gc * p.H + h) * n; };
  auto store2 = [](T* dst, float lo, float hi) { *reinterpret_cast<uint32_t*>(dst) = TypeTraits<T>::pack(lo, hi); };
  auto store4 = [](T* dst, float4 v) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(TypeTraits<T>::pack(v.x, v.y), TypeTraits<T>::pack(v.z, v.w));
  };

  // Row 0 of the chunk in w and k; rows add r * stride.t.
  const int64_t w0 = ci.b * p.sw.b + (int64_t)ci.t0 * p.sw.t + h * p.sw.h;
  const int64_t k0 = ci.b * p.sk.b + (int64_t)ci.t0 * p.sk.t + h * p.sk.h;
  // 16-byte loads need 16-byte aligned rows: aligned pointers and strides in whole 16-byte units.
  const int wq = p.w_is_bf16 ? 8 : 4;  // elements of w per 16 bytes
  const bool vec = (reinterpret_cast<uintptr_t>(p.w) & 15) == 0 && (reinterpret_cast<uintptr_t>(p.k) & 15) == 0 &&
                   ((p.sw.b | p.sw.t | p.sw.h) & (wq - 1)) == 0 && ((p.sk.b | p.sk.t | p.sk.h) & 7) == 0;

  // Load W, K: each thread takes groups of 8 consecutive elements of a row. All loads of a thread are issued
  // before the first use (a fully unrolled loop of compile-time length): an earlier version looped
  // load -> store, and each iteration waited a full global-memory latency.
  auto load_wk = [&](auto mode) {
    constexpr int kMode = decltype(mode)::value;  // 0: scalar, 1: 16-byte with f32 w, 2: 16-byte with bf16 w
    constexpr int kG = C * D / 8 / 128;
    float wv[kG][8];
    uint32_t kv[kG][4];
#pragma unroll
    for (int it = 0; it < kG; ++it) {
      const int e = it * 128 + tid, r = e / (D / 8), c = e % (D / 8) * 8;
#pragma unroll
      for (int q = 0; q < 8; ++q) wv[it][q] = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) kv[it][q] = 0u;
      if (r < ci.len) {
        const int64_t ow = w0 + r * p.sw.t + c, ok = k0 + r * p.sk.t + c;
        if constexpr (kMode == 0) {
#pragma unroll
          for (int q = 0; q < 8; ++q) wv[it][q] = load_w(p.w, ow + q, p.w_is_bf16);
#pragma unroll
          for (int q = 0; q < 4; ++q) kv[it][q] = (uint32_t)k16[ok + 2 * q] | ((uint32_t)k16[ok + 2 * q + 1] << 16);
        } else {
          if constexpr (kMode == 1) {
            const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.w) + ow);
            const float4 a = __ldg(src), b = __ldg(src + 1);
            wv[it][0] = a.x, wv[it][1] = a.y, wv[it][2] = a.z, wv[it][3] = a.w;
            wv[it][4] = b.x, wv[it][5] = b.y, wv[it][6] = b.z, wv[it][7] = b.w;
          } else {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.w) + ow));
            const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {  // bf16 -> f32 is the top half of the f32 bit pattern
              wv[it][2 * q] = __uint_as_float(u[q] << 16);
              wv[it][2 * q + 1] = __uint_as_float(u[q] & 0xffff0000u);
            }
          }
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(k16 + ok));
          kv[it][0] = v.x, kv[it][1] = v.y, kv[it][2] = v.z, kv[it][3] = v.w;
        }
      }
    }
#pragma unroll
    for (int it = 0; it < kG; ++it) {
      const int e = it * 128 + tid, r = e / (D / 8), c = e % (D / 8) * 8;
      float4* dw = reinterpret_cast<float4*>(sW + r * LW + c);
      dw[0] = make_float4(tf32(wv[it][0]), tf32(wv[it][1]), tf32(wv[it][2]), tf32(wv[it][3]));
      dw[1] = make_float4(tf32(wv[it][4]), tf32(wv[it][5]), tf32(wv[it][6]), tf32(wv[it][7]));
      *reinterpret_cast<uint4*>(sK + r * LK + c) = make_uint4(kv[it][0], kv[it][1], kv[it][2], kv[it][3]);
      // W in the tensor-core dtype, rounded once from the input.
      *reinterpret_cast<uint4*>(ws_tile(p.ws.w, C * D) + r * D + c) =
          make_uint4(TypeTraits<T>::pack(wv[it][0], wv[it][1]), TypeTraits<T>::pack(wv[it][2], wv[it][3]),
                     TypeTraits<T>::pack(wv[it][4], wv[it][5]), TypeTraits<T>::pack(wv[it][6], wv[it][7]));
    }
  };
  // beta first, so that its load is in flight with those of W and K.
  const float bt = tid < ci.len ? p.beta[ci.b * p.sbeta.b + (int64_t)(ci.t0 + tid) * p.sbeta.t + h * p.sbeta.h] : 0.f;
  if (!vec)
    load_wk(std::integral_constant<int, 0>{});
  else if (p.w_is_bf16)
    load_wk(std::integral_constant<int, 2>{});
  else
    load_wk(std::integral_constant<int, 1>{});
  if (tid < C) sBeta[tid] = bt;
  __syncthreads();

  // X = strict_lower(W K^T) (Eq. 12) and A = strict_lower(b W W^T) (Eq. 10), both with W's rows as B: X as
  // X^T = K W^T (warp w: rows 16w.. of X^T, K's rows as the A operand, unpacked once per fragment), stored so
  // (TF32) for M = T b X to read along k; A in f32 for the solve, into the tile of K once every warp is done with K.
  {
    float accX[NTC][4], accA[NTC][4];
    zero_acc(accX);
    zero_acc(accA);
    warp_mma_tf32_pairs2<NTC, D>(
        accX, accA,
        [&](int j, int kk) {
          return TypeTraits<T>::unpack(*reinterpret_cast<const uint32_t*>(sK + (rw + j) * LK + kk));
        },
        [&](int i, int kk) { return *reinterpret_cast<const float2*>(sW + (rw + i) * LW + kk); },
        [&](int kk, int i) { return *reinterpret_cast<const float2*>(sW + i * LW + kk); });
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = rw + g + 8 * half, i = nt * 8 + 2 * t4;  // X^T(j, i) = X(i, j), kept where i > j
        *reinterpret_cast<float2*>(sX + j * LS + i) =
            make_float2(i > j ? tf32(accX[nt][2 * half]) : 0.f, i + 1 > j ? tf32(accX[nt][2 * half + 1]) : 0.f);
      }
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = rw + g + 8 * half;
      const float bi = sBeta[i];
#pragma unroll
      for (int nt = 0; nt < NTC; ++nt) {
        const int j = nt * 8 + 2 * t4;
        *reinterpret_cast<float2*>(sT + i * LS + j) =
            make_float2(i > j ? bi * accA[nt][2 * half] : 0.f, i > j + 1 ? bi * accA[nt][2 * half + 1] : 0.f);
      }
    }
  }
  __syncthreads();

  // T = (I + A)^{-1} in place (ut_solve.cuh: blocked in 16 x 16, diagonal blocks by substitution, the others on the
  // tensor cores in 3xTF32).
  ut_solve_tc<LS>(sT);
  // T b (column l scaled by beta_l: U and M both use T b), rounded to TF32 as an operand; each warp scales the
  // rows it reads in U and M.
#pragma unroll
  for (int it = 0; it < 8; ++it) {
    const int q = it * 32 + lane, r = rw + q / 16, c = q % 16 * 4;
    float4* pt = reinterpret_cast<float4*>(sT + r * LS + c);
    const float4 v = *pt, b = *reinterpret_cast<const float4*>(sBeta + c);
    *pt = make_float4(tf32(v.x * b.x), tf32(v.y * b.y), tf32(v.z * b.z), tf32(v.w * b.w));
  }
  __syncwarp();

  // K rows of this lane in the accumulator layout of the K^ product (K's tile now holds T): from global memory
  // (L2), issued here so that M hides the latency. Raw bf16/f16.
  uint2 kraw[D / 16][2];  // K(rw + g + 8 half, 16 p + 4 t .. + 3), the layout of quad()
#pragma unroll
  for (int np = 0; np < D / 16; ++np)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = rw + g + 8 * half, d = 16 * np + 4 * t4;
      kraw[np][half] = make_uint2(0u, 0u);
      if (j < ci.len) {
        const int64_t o = k0 + j * p.sk.t + d;
        kraw[np][half] = vec ? __ldg(reinterpret_cast<const uint2*>(k16 + o))
                             : make_uint2((uint32_t)k16[o] | ((uint32_t)k16[o + 1] << 16),
                                          (uint32_t)k16[o + 2] | ((uint32_t)k16[o + 3] << 16));
      }
    }

  // M = (T b) X (Eq. 12), each warp from its own rows of T b; stored transposed (TF32) in X's tile once every warp
  // is done with X, so that K^ reads M^T along rows.
  {
    float acc[NTC][4];
    zero_acc(acc);
    warp_mma_tf32_pairs<NTC, C>(
        acc, [&](int i, int kk) { return *reinterpret_cast<const float2*>(sT + (rw + i) * LS + kk); },
        [&](int kk, int n) { return *reinterpret_cast<const float2*>(sX + n * LS + kk); });
    if (p.ws.m) {  // the forward's main kernel reads M; the backward recomputes it (api.cu gives it none)
      T* gM = ws_tile(p.ws.m, C * C);
#pragma unroll
      for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          store2(gM + (rw + g + 8 * half) * C + nt * 8 + 2 * t4, acc[nt][2 * half], acc[nt][2 * half + 1]);
    }
    __syncthreads();  // every warp is done with X
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sX[(nt * 8 + 2 * t4 + e % 2) * LS + rw + g + 8 * (e / 2)] = tf32(acc[nt][e]);
  }
  __syncthreads();  // M^T complete
  // K^ = K - M^T W   (Eq. 14). In column blocks of 64 (fewer live registers at D = 128).
#pragma unroll
  for (int db = 0; db < D / 64; ++db) {
    float acc[8][4];
    zero_acc(acc);
    warp_mma_tf32_npairs<8, C>(
        acc, [&](int j, int i) { return sX[(rw + j) * LS + i]; },
        [&](int i, int n) { return *reinterpret_cast<const float2*>(sW + i * LW + db * 64 + n); });
    T* gK = ws_tile(p.ws.khat, C * D);
#pragma unroll
    for (int np = 0; np < 4; ++np)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = rw + g + 8 * half, d = db * 64 + 16 * np + 4 * t4;
        const float2 ka = TypeTraits<T>::unpack(kraw[db * 4 + np][half].x),
                     kb = TypeTraits<T>::unpack(kraw[db * 4 + np][half].y);
        const float4 mw = quad(acc, np, half);
        store4(gK + j * D + d, make_float4(ka.x - mw.x, ka.y - mw.y, kb.x - mw.z, kb.y - mw.w));
      }
  }
  // U = (T b) W (Eq. 10), each warp from its own rows of T b; after K^ so that its accumulator is not live there.
  {
    float accU[NTD][4];
    zero_acc(accU);
    warp_mma_tf32_npairs<NTD, C>(accU, [&](int i, int kk) { return sT[(rw + i) * LS + kk]; },
                                 [&](int kk, int n) { return *reinterpret_cast<const float2*>(sW + kk * LW + n); });
    T* gU = ws_tile(p.ws.u, C * D);
#pragma unroll
    for (int np = 0; np < D / 16; ++np)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        store4(gU + (rw + g + 8 * half) * D + 16 * np + 4 * t4, quad(accU, np, half));
    __syncthreads();  // every warp is done with M^T (sX) and T b (sT): U (TF32) takes their place
#pragma unroll
    for (int np = 0; np < D / 16; ++np)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float4 u = quad(accU, np, half);
        *reinterpret_cast<float4*>(sU + (rw + g + 8 * half) * LW + 16 * np + 4 * t4) =
            make_float4(tf32(u.x), tf32(u.y), tf32(u.z), tf32(u.w));
      }
  }
  __syncthreads();  // U complete
  // E = -U^T W (Eq. 32): D rows, 16 per warp and row block (two blocks per warp at D = 128).
#pragma unroll
  for (int nb = 0; nb < D / 64; ++nb) {
    const int n0 = nb * 64 + rw;
    float acc[NTD][4];
    zero_acc(acc);
    warp_mma_tf32_npairs<NTD, C>(acc, [&](int n, int i) { return sU[i * LW + n0 + n]; },
                                 [&](int i, int d) { return *reinterpret_cast<const float2*>(sW + i * LW + d); });
    T* gE = ws_tile(p.ws.step, D * D);
#pragma unroll
    for (int np = 0; np < D / 16; ++np)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float4 e = quad(acc, np, half);
        store4(gE + (n0 + g + 8 * half) * D + 16 * np + 4 * t4, make_float4(-e.x, -e.y, -e.z, -e.w));
      }
  }
}

}  // namespace pathattn::cuda
