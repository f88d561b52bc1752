// Preprocess on the tensor cores (the forward without kcache): the same quantities as prep.cuh (docs/math.md
// Eq. 10-14), with the five C x C x D products as TF32 mma.sync (m16n8k8, f32 accumulation) and the triangular
// solve in plain f32 on the CUDA cores, blocked in 16 x 16 tiles so that its dependency chain is 16 steps, not 64.
//
// Why: the all-f32 CUDA-core version (prep.cuh) took 18 ms of a 39 ms forward at B x T = 32 x 4096, H = 32,
// D = 64 on the H200 (docs/perf/notes.md): its per-element dot products were shared-memory bound. TF32 products
// (10-bit mantissa, like fla's tl.dot on f32 inputs) feed factors that are stored in bf16/f16 anyway.
//
// One CTA of 4 warps per (chunk, kv head); warp w computes rows 16w..16w+15 of each product.
//
// v5 (docs/perf/notes.md): ncu showed v4 issue-bound at 12.5% occupancy (two 95 KB CTAs per SM, ~9k warp
// instructions per warp, IPC 1.2, 70% of cycles with no eligible warp). Now: 66 KB (three CTAs per SM) by keeping
// K in its input dtype and reusing the C x C tiles (A -> X -> U, T -> T b -> M); operands rounded to TF32 once,
// when they are written to shared memory, instead of at every fragment load; W written out from registers at load.
// It also forms E = -U^T W (Eq. 32), the main kernel's per-chunk query step.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/params.h"

namespace pathattn::cuda {

namespace prep_tc_detail {
constexpr int C = kChunk;
constexpr int LS = C + 8;  // f32 row stride of C x C tiles: 8 (mod 32) keeps both fragment patterns
                           // (g * LS + t and t * LS + g, g < 8, t < 4) on distinct banks (one pattern 2-way for sW)

__device__ __forceinline__ float tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// acc[16 x 8*NT] += A[16 x K] B[K x 8*NT] with A(i, k) = a(i, k), B(k, n) = b(k, n): values already TF32-exact
// (rounded when stored, or bf16/f16 inputs), so fragments are plain shared-memory loads.
template <int NT, int K, typename FA, typename FB>
__device__ __forceinline__ void warp_mma_tf32(float (&acc)[NT][4], FA a, FB b) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    const uint32_t a0 = __float_as_uint(a(g, k0 + t)), a1 = __float_as_uint(a(g + 8, k0 + t)),
                   a2 = __float_as_uint(a(g, k0 + t + 4)), a3 = __float_as_uint(a(g + 8, k0 + t + 4));
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint32_t b0 = __float_as_uint(b(k0 + t, nt * 8 + g)), b1 = __float_as_uint(b(k0 + t + 4, nt * 8 + g));
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

// Shared memory of prep_tc_kernel (floats unless noted).
template <typename T, int D>
struct PrepTcSmem {
  static constexpr int C = kChunk, LS = prep_tc_detail::LS;
  static constexpr int LW = D + 8;  // sW row stride (f32) and of U in sA
  static constexpr int LK = D + 8;  // sK row stride (elements of T)
  static constexpr int kW = C * LW;                                   // sW  [C][LW]  W (TF32)
  static constexpr int kK = (C * LK * (int)sizeof(T) + 15) / 16 * 4;  // sK  [C][LK]  K (input dtype), in floats
  static constexpr int kA = C * (LS > LW ? LS : LW);                  // sA  A, then X (TF32), then U (TF32)
  static constexpr int kT = C * LS;                                   // sT  T, then T b (TF32), then M (TF32)
  static constexpr int kY = 3 * 16 * 16;                              // sY  scratch of the blocked solve
  static constexpr int kBytes = (kW + kK + kA + kT + kY + C) * 4;
};

template <typename T, int D>
__global__ void __launch_bounds__(128) prep_tc_kernel(Params p) {
  using namespace prep_tc_detail;
  using SM = PrepTcSmem<T, D>;
  constexpr int LW = SM::LW, LK = SM::LK;
  constexpr int NTD = D / 8, NTC = C / 8;
  extern __shared__ float smem[];
  float* sW = smem;
  T* sK = reinterpret_cast<T*>(sW + SM::kW);
  float* sA = sW + SM::kW + SM::kK;
  float* sT = sA + SM::kA;
  float* sY = sT + SM::kT;
  float* sBeta = sY + SM::kY;

  const int gc = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int rw = warp * 16;  // this warp's first row
  const ChunkInfo ci = p.chunks[gc];
  const T* k = static_cast<const T*>(p.k);

  const int64_t base = ((int64_t)gc * p.H + h) * C;
  T* gU = static_cast<T*>(p.ws.u) + base * D;
  T* gW = static_cast<T*>(p.ws.w) + base * D;
  T* gK = static_cast<T*>(p.ws.khat) + base * D;
  T* gM = static_cast<T*>(p.ws.m) + base * C;
  T* gE = static_cast<T*>(p.ws.step) + ((int64_t)gc * p.H + h) * D * D;
  auto store2 = [](T* dst, float lo, float hi) { *reinterpret_cast<uint32_t*>(dst) = TypeTraits<T>::pack(lo, hi); };

  // All loads of a thread are issued before the first use (a fully unrolled loop of compile-time length):
  // the first version looped load -> store, and each iteration waited a full global-memory latency.
  {
    constexpr int kIters = C * D / 128;
    float wv[kIters];
    T kv[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * 128 + tid, r = e / D, d = e % D;
      wv[it] = 0.f;
      kv[it] = TypeTraits<T>::from_float(0.f);
      if (r < ci.len) {
        const int64_t t = ci.t0 + r;
        wv[it] = load_w(p.w, ci.b * p.sw.b + t * p.sw.t + h * p.sw.h + d, p.w_is_bf16);
        kv[it] = k[ci.b * p.sk.b + t * p.sk.t + h * p.sk.h + d];
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * 128 + tid, r = e / D, d = e % D;
      sW[r * LW + d] = tf32(wv[it]);
      sK[r * LK + d] = kv[it];
      gW[e] = TypeTraits<T>::from_float(wv[it]);  // W in the tensor-core dtype, rounded once from the input
    }
  }
#pragma unroll
  for (int e = tid; e < C * LS; e += 128) sT[e] = 0.f;
  for (int r = tid; r < C; r += blockDim.x)
    sBeta[r] = r < ci.len ? p.beta[ci.b * p.sbeta.b + (int64_t)(ci.t0 + r) * p.sbeta.t + h * p.sbeta.h] : 0.f;
  __syncthreads();

  // A = strict_lower(b W W^T)   (Eq. 10), f32 for the solve.
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
  // T b (column l scaled by beta_l: U and M both use T b), rounded to TF32 as an operand.
#pragma unroll
  for (int e = tid; e < C * C; e += 128) sT[(e / C) * LS + e % C] = tf32(sT[(e / C) * LS + e % C] * sBeta[e % C]);

  // X = strict_lower(W K^T) into sA (A is dead after the solve)   (Eq. 12)
  {
    float acc[NTC][4];
    zero_acc(acc);
    warp_mma_tf32<NTC, D>(acc, [&](int i, int kk) { return sW[(rw + i) * LW + kk]; },
                          [&](int kk, int n) { return TypeTraits<T>::to_float(sK[n * LK + kk]); });
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = rw + g + 8 * (e / 2), j = nt * 8 + 2 * t4 + e % 2;
        sA[i * LS + j] = i > j ? tf32(acc[nt][e]) : 0.f;
      }
  }
  __syncthreads();

  // U = (T b) W (Eq. 10) and M = (T b) X (Eq. 12); each warp reads only its own rows of T b.
  float accU[NTD][4];
  zero_acc(accU);
  warp_mma_tf32<NTD, C>(accU, [&](int i, int kk) { return sT[(rw + i) * LS + kk]; },
                        [&](int kk, int n) { return sW[kk * LW + n]; });
#pragma unroll
  for (int nt = 0; nt < NTD; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      store2(gU + (rw + g + 8 * half) * D + nt * 8 + 2 * t4, accU[nt][2 * half], accU[nt][2 * half + 1]);
  {
    float acc[NTC][4];
    zero_acc(acc);
    warp_mma_tf32<NTC, C>(acc, [&](int i, int kk) { return sT[(rw + i) * LS + kk]; },
                          [&](int kk, int n) { return sA[kk * LS + n]; });
    __syncwarp();  // this warp's reads of its T b rows are done: M takes their place
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = rw + g + 8 * half, j = nt * 8 + 2 * t4;
        sT[i * LS + j] = tf32(acc[nt][2 * half]);
        sT[i * LS + j + 1] = tf32(acc[nt][2 * half + 1]);
        store2(gM + i * C + j, acc[nt][2 * half], acc[nt][2 * half + 1]);
      }
  }
  __syncthreads();  // M complete in sT; every warp is done with X in sA
  // U (TF32) into sA for E, rows of this warp.
#pragma unroll
  for (int nt = 0; nt < NTD; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = rw + g + 8 * half, d = nt * 8 + 2 * t4;
      sA[i * LW + d] = tf32(accU[nt][2 * half]);
      sA[i * LW + d + 1] = tf32(accU[nt][2 * half + 1]);
    }
  // K^ = K - M^T W   (Eq. 14); row j of K^ needs column j of M.
  {
    float acc[NTD][4];
    zero_acc(acc);
    warp_mma_tf32<NTD, C>(acc, [&](int j, int i) { return sT[i * LS + rw + j]; },
                          [&](int i, int n) { return sW[i * LW + n]; });
#pragma unroll
    for (int nt = 0; nt < NTD; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = rw + g + 8 * half, d = nt * 8 + 2 * t4;
        const float2 kk = TypeTraits<T>::unpack(*reinterpret_cast<const uint32_t*>(sK + j * LK + d));
        store2(gK + j * D + d, kk.x - acc[nt][2 * half], kk.y - acc[nt][2 * half + 1]);
      }
  }
  __syncthreads();  // U complete in sA
  // E = -U^T W (Eq. 32): D rows, 16 per warp and row block (two blocks per warp at D = 128).
#pragma unroll
  for (int nb = 0; nb < D / 64; ++nb) {
    const int n0 = nb * 64 + rw;
    float acc[NTD][4];
    zero_acc(acc);
    warp_mma_tf32<NTD, C>(acc, [&](int n, int i) { return sA[i * LW + n0 + n]; },
                          [&](int i, int d) { return sW[i * LW + d]; });
#pragma unroll
    for (int nt = 0; nt < NTD; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        store2(gE + (n0 + g + 8 * half) * D + nt * 8 + 2 * t4, -acc[nt][2 * half], -acc[nt][2 * half + 1]);
  }
}

}  // namespace pathattn::cuda
