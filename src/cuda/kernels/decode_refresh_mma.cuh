// The checkpointed cache's refresh (docs/math.md Eq. 36: the old rows carried by the pending product, c_j <- M^T c_j)
// on tensor cores, for bf16 keys: the same blocks and rows as decode_refresh_kernel (kernels/decode_checkpoint.cuh,
// decode_refresh_block), the product on mma.sync m16n8k16 instead of D FMAs per element from shared memory. That
// kernel streams M from shared memory at ~16 FMAs per clock per SM, ~33 ms per refresh at D 128, B 64, 16k, H 8 (a
// third of the mean step at period 64; docs/perf/notes.md, twelfth session); as products it is ~1 GFLOP of tensor
// work per 1 GB of rows, so the rows' bytes bound it.
//
//   out = C M,  C: 16 cached rows x D (bf16, as stored; A operand),  M: D x D in f32 as the sum of three bf16 parts
//   M_hi + M_mid + M_lo (bf16_split3, kernels/common.cuh), so that out is the f32 product up to the order of the
//   sums (every bf16 x bf16 product is exact); rounded once to bf16 and stored in place.
//
// Layout: one warp per 16 rows (rows base + gq and base + gq + 8 of lane 4 gq + tq), the 8 warps interleaved over the
// block's rows. The order of d inside the product is free as long as A and B agree: logical k of k-step ks maps to
// d = (D / 4) tq + 4 ks + {0, 1, 2, 3} as in kernels/decode_mma.cuh, so each lane loads D / 4 contiguous elements of
// its two rows (16-byte loads) and the block builds M's B fragments in that order once, in shared memory
// ([part][ks][n-tile][lane] as uint2: one 8-byte load per product per lane, conflict-free). A warp loads all of its
// rows before it stores any; no other warp touches them.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/decode_checkpoint.cuh"

namespace pathattn::cuda {

constexpr int kRefreshMmaParts = 3;  // M_hi, M_mid, M_lo

template <int D>
constexpr int decode_refresh_mma_smem_bytes() {
  return kRefreshMmaParts * (D / 16) * (D / 8) * 32 * 8;  // D 64: 24 KB, D 128: 96 KB
}

template <int D>
__global__ void __launch_bounds__(kCarryThreads) decode_refresh_mma_kernel(const DecodeParams p) {
  using T = __nv_bfloat16;
  constexpr int kWarps = kCarryThreads / 32, kRows = 16;
  constexpr int kKS = D / 16;   // k-steps
  constexpr int kNT = D / 8;    // n-tiles of the output row
  constexpr int kKC = D / 4;    // elements of a row per lane
  constexpr int kKV = kKC / 8;  // ... as 16-byte vectors
  constexpr int kFrags = kKS * kNT * 32;
  static_assert(kKV >= 1, "D = 64 or 128");
  extern __shared__ uint2 smem_refresh_frag[];  // [kRefreshMmaParts][kKS][kNT][32]

  const RefreshBlock rb = decode_refresh_block(p);
  if (!rb.ok) return;
  const float* M = p.carry + (static_cast<int64_t>(rb.b) * p.H + rb.h) * D * D;
  // B fragments: lane (gq, tq) of n-tile nt holds B[k][n] for n = gq, k = 2 tq + {0, 1} and 2 tq + 8 + {0, 1}, i.e.
  // M[d][e] for e = 8 nt + gq, d = (D / 4) tq + 4 ks + {0, 1} and + {2, 3}. gq varies fastest over the threads, so
  // consecutive threads read consecutive e.
  for (int i = threadIdx.x; i < kFrags; i += kCarryThreads) {
    const int gq = i % 8, tq = (i / 8) % 4, nt = (i / 32) % kNT, ks = i / (32 * kNT);
    const int e = 8 * nt + gq, d = kKC * tq + 4 * ks;
    Bf16Parts x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = bf16_split3(M[(d + j) * D + e]);
    uint32_t part[kRefreshMmaParts][2];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      part[0][w] = TypeTraits<T>::pack(x[2 * w].hi, x[2 * w + 1].hi);
      part[1][w] = TypeTraits<T>::pack(x[2 * w].mid, x[2 * w + 1].mid);
      part[2][w] = TypeTraits<T>::pack(x[2 * w].lo, x[2 * w + 1].lo);
    }
    const int slot = (ks * kNT + nt) * 32 + 4 * gq + tq;
#pragma unroll
    for (int q = 0; q < kRefreshMmaParts; ++q)
      smem_refresh_frag[q * kFrags + slot] = make_uint2(part[q][0], part[q][1]);
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
  T* const ck = static_cast<T*>(p.ck) + rb.b * p.sck.b + rb.h * p.sck.h;
  const int d0 = kKC * tq;
  for (int base = rb.r0 + kRows * warp; base < rb.r1; base += kRows * kWarps) {
    const int rlo = base + gq, rhi = base + gq + 8;  // this lane's rows (A rows gq and gq + 8)
    uint4 alo[kKV], ahi[kKV];
#pragma unroll
    for (int v = 0; v < kKV; ++v) {
      const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
      alo[v] = rlo < rb.r1 ? *reinterpret_cast<const uint4*>(ck + rlo * p.sck.t + d0 + 8 * v) : zero;
      ahi[v] = rhi < rb.r1 ? *reinterpret_cast<const uint4*>(ck + rhi * p.sck.t + d0 + 8 * v) : zero;
    }
#pragma unroll 2
    for (int nt = 0; nt < kNT; ++nt) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        // k 2 tq, 2 tq + 1 <- the chunk's elements 4 ks, 4 ks + 1 (word 2 ks); k + 8 <- 4 ks + 2, + 3 (word 2 ks + 1)
        const uint32_t a[4] = {u4_word(alo[(2 * ks) / 4], (2 * ks) % 4), u4_word(ahi[(2 * ks) / 4], (2 * ks) % 4),
                               u4_word(alo[(2 * ks + 1) / 4], (2 * ks + 1) % 4),
                               u4_word(ahi[(2 * ks + 1) / 4], (2 * ks + 1) % 4)};
#pragma unroll
        for (int q = kRefreshMmaParts - 1; q >= 0; --q) {  // the small parts first
          const uint2 bq = smem_refresh_frag[q * kFrags + (ks * kNT + nt) * 32 + lane];
          mma16816<T>(acc, a, bq.x, bq.y);
        }
      }
      // acc: out[gq][8 nt + 2 tq + {0, 1}] and out[gq + 8][...]
      const int col = 8 * nt + 2 * tq;
      if (rlo < rb.r1) *reinterpret_cast<uint32_t*>(ck + rlo * p.sck.t + col) = TypeTraits<T>::pack(acc[0], acc[1]);
      if (rhi < rb.r1) *reinterpret_cast<uint32_t*>(ck + rhi * p.sck.t + col) = TypeTraits<T>::pack(acc[2], acc[3]);
    }
  }
}

}  // namespace pathattn::cuda
