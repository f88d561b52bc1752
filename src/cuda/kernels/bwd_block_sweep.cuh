// The two-level backward's block kernels (docs/math.md Eq. 54-57; cuda/bwd_blocks.h BwdBlockItem), one CTA of 2 D
// threads per (block s .. e, kv head); a sequence's first block has nothing to do.
//
// Before the main kernel, the block preprocess walks the block from its first chunk with X = S_m^T (D x D, f32
// registers; S_m = P_{m-1} .. P_s, S_s = I):
//   X_m = X              to p.sprefix (tensor-core dtype), for the gradient sweep
//   Q'_m = Q^_m X^T      for every query head of the group, to p.qfar (Eq. 48, 54)
//   X <- X + X E_m       (S_{m+1}^T = S_m^T P_m^T)
// and after the block's last chunk F = X - I = Pi^T - I to p.blockstep (Eq. 53, 55), where a task steps over it.
//
// After the main kernel, the block gradient sweep walks it back from e with G = d loss / d S_{m+1} (D x D, f32
// registers; G = dPi_b at the start, zero in a sequence's last block):
//   dP_m  += G X_m                              (dpacc; Eq. 56)
//   dQ^_m += dQ'_m X_m                          (dqacc, every query head)
//   G <- G + E_m G + sum_heads Q^_m^T dQ'_m     (G_m = P_m^T G_{m+1} + Q^_m^T dQ'_m; Eq. 57)
// At the block's first chunk X = I: dP_s and dQ^_s take G and dQ'_s in f32 as they are. The CTA owns its chunks'
// dP and dQ^ rows (the main kernel is done with them), so its adds are plain stores, the same bits on every run.
//
// Warp w owns rows 16 w.. of the D x D matrices (accumulator layout); in the C x D products rows 16 (w % 4).. and
// columns 64 (w / 4).. of the result. Products by mma.sync through fwd_tiles.cuh's gemm_nn / gemm_nt, on
// row-padded shared tiles.
#pragma once

#include "cuda/bwd_blocks.h"
#include "cuda/kernels/bwd_tiles.cuh"
#include "cuda/kernels/fwd_block_carry.cuh"

namespace pathattn::cuda {

template <int D>
struct BwdBlockSmem {
  static constexpr int C = kChunk, LD = D + 8;  // padded rows: conflict-free ldmatrix
  // prep: X, E, Q^;  grad: X_m, E_m, G, Q^, dQ'
  static constexpr int kPrepBytes = (2 * D + C) * LD * 2;
  static constexpr int kGradBytes = (3 * D + 2 * C) * LD * 2;
};

template <typename T, int D>
__global__ void __launch_bounds__(2 * D) bwd_block_prep_kernel(const BwdParams p) {
  using namespace fwd_detail;
  using namespace bwd_detail;
  using S = BwdBlockSmem<D>;
  constexpr int C = kChunk, LD = S::LD, NT = D / 8, KD = D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sX = reinterpret_cast<T*>(smem_raw);
  T* sE = sX + D * LD;
  T* sQ = sE + D * LD;

  const int h = blockIdx.y, blk = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const BwdBlockItem it = block_item_of(p, blk, bwd_block_item);
  if (it.skip) return;
  const int xr0 = warp * 16 + g;                       // this thread's rows of X: xr0, xr0 + 8
  const int qr0 = (warp % 4) * 16, qc0 = 64 * (warp / 4);  // this warp's share of the C x D products
  float x[NT][4];
  identity_rows(x, 64 * (warp / 4));

  for (int m = it.s; m <= it.e; ++m) {
    const bool stepping = m < it.e || it.has_step;
    if (stepping) {  // E_m, D rows in row blocks of C (landed by the first head's wait below)
      const T* em = static_cast<const T*>(p.ws.step) + ((int64_t)m * p.H + h) * D * D;
#pragma unroll
      for (int r = 0; r < D; r += C) load_tile<T, D, false>(sE + r * LD, LD, em + r * D, D, C);
    }
    // X_m: into shared memory (the B operand of Q') and out to the gradient sweep.
    T* xg = static_cast<T*>(p.sprefix) + ((int64_t)m * p.H + h) * D * D;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t v = TypeTraits<T>::pack(x[nt][2 * half], x[nt][2 * half + 1]);
        *reinterpret_cast<uint32_t*>(sX + (xr0 + 8 * half) * LD + nt * 8 + 2 * t4) = v;
        *reinterpret_cast<uint32_t*>(xg + (xr0 + 8 * half) * D + nt * 8 + 2 * t4) = v;
      }
    for (int j = 0; j < p.group; ++j) {  // Q'_m = Q^_m X^T per query head
      const int64_t qrow = (int64_t)m * p.HQ + h * p.group + j;
      load_tile<T, D, false>(sQ, LD, static_cast<const T*>(p.qhat) + qrow * C * D, D, C);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();  // Q^ (and E_m), X in shared memory for every warp
      uint32_t qa[KD][4];
      load_a<KD>(qa, sQ, LD, qr0);
      float out[8][4];
      zero(out);
      gemm_nt<T, 8, KD, false>(out, qa, sX + qc0 * LD, LD);  // B = X's rows qc0..: [n = d'][k = d]
      store_acc<T, 8>(out, static_cast<T*>(p.qfar) + qrow * C * D + qc0, D, qr0);
      __syncthreads();  // sQ is free for the next head
    }
    if (stepping) {  // X <- X + X E_m
      uint32_t xa[KD][4];
      to_a_frags<T, NT>(x, xa, 1.f);
      gemm_nn<T, NT, KD, false>(x, xa, sE, LD);
    }
    __syncthreads();  // sX and sE are free for the next chunk
  }
  if (it.has_step) {  // F = X - I = Pi^T - I, row-major (as E: a task's K~ <- K~ + K~ F)
    T* f = static_cast<T*>(p.blockstep) + ((int64_t)blk * p.H + h) * D * D;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = xr0 + 8 * half, col = nt * 8 + 2 * t4;
        *reinterpret_cast<uint32_t*>(f + row * D + col) = TypeTraits<T>::pack(
            x[nt][2 * half] - (row == col ? 1.f : 0.f), x[nt][2 * half + 1] - (row == col + 1 ? 1.f : 0.f));
      }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(2 * D) bwd_block_grad_kernel(const BwdParams p) {
  using namespace fwd_detail;
  using namespace bwd_detail;
  using S = BwdBlockSmem<D>;
  constexpr int C = kChunk, LD = S::LD, NT = D / 8, KD = D / 16, KC = C / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sX = reinterpret_cast<T*>(smem_raw);
  T* sE = sX + D * LD;
  T* sG = sE + D * LD;
  T* sQ = sG + D * LD;
  T* sDQ = sQ + C * LD;

  const int h = blockIdx.y, blk = blockIdx.x;
  const int warp = threadIdx.x / 32;
  const BwdBlockItem it = block_item_of(p, blk, bwd_block_item);
  if (it.skip) return;
  const int xr0 = warp * 16;                           // this warp's rows of G and dP
  const int qr0 = (warp % 4) * 16, qc0 = 64 * (warp / 4);  // this warp's share of the C x D products
  float gm[NT][4];
  if (it.has_step) {
    const float* dpi = p.dpiacc + ((int64_t)blk * p.H + h) * D * D;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 v = *reinterpret_cast<const float2*>(dpi + (xr0 + lane / 4 + 8 * half) * D + nt * 8 + 2 * (lane % 4));
        gm[nt][2 * half] = v.x;
        gm[nt][2 * half + 1] = v.y;
      }
  } else {
    zero(gm);
  }

  for (int m = it.e; m >= it.s; --m) {
    const bool first = m == it.s;  // X_s = I
    float* dp = p.dpacc + ((int64_t)m * p.H + h) * D * D;
    if (first) {
      add_acc_f32<NT>(gm, dp, D, xr0);
    } else {
      const T* xm = static_cast<const T*>(p.sprefix) + ((int64_t)m * p.H + h) * D * D;
      const T* em = static_cast<const T*>(p.ws.step) + ((int64_t)m * p.H + h) * D * D;
#pragma unroll
      for (int r = 0; r < D; r += C) {
        load_tile<T, D, false>(sX + r * LD, LD, xm + r * D, D, C);
        load_tile<T, D, false>(sE + r * LD, LD, em + r * D, D, C);
      }
      cp_async_commit();
      store_acc<T, NT>(gm, sG, LD, xr0);
      cp_async_wait<0>();
      __syncthreads();  // X_m, E_m, G for every warp
      uint32_t ga[KD][4];
      to_a_frags<T, NT>(gm, ga, 1.f);
      float acc[NT][4];
      zero(acc);
      gemm_nn<T, NT, KD, false>(acc, ga, sX, LD);  // G X_m
      add_acc_f32<NT>(acc, dp, D, xr0);
      uint32_t ea[KD][4];
      load_a<KD>(ea, sE, LD, xr0);
      gemm_nn<T, NT, KD, false>(gm, ea, sG, LD);  // G <- G + E_m G
    }
    for (int j = 0; j < p.group; ++j) {
      const int64_t qrow = (int64_t)m * p.HQ + h * p.group + j;
      const float* dqf = p.dqfar + qrow * C * D;
      float* dq = p.dqacc + qrow * C * D;
      if (first) {  // dQ^_s += dQ'_s (each thread its own elements)
        for (int e = threadIdx.x; e < C * D / 4; e += blockDim.x) {
          const float4 a = reinterpret_cast<const float4*>(dqf)[e];
          float4 b = reinterpret_cast<float4*>(dq)[e];
          b.x += a.x, b.y += a.y, b.z += a.z, b.w += a.w;
          reinterpret_cast<float4*>(dq)[e] = b;
        }
        continue;
      }
      load_tile<T, D, false>(sQ, LD, static_cast<const T*>(p.qhat) + qrow * C * D, D, C);
      cp_async_commit();
      for (int e = threadIdx.x; e < C * D / 2; e += blockDim.x) {  // dQ'_m in the tensor-core dtype
        const float2 a = reinterpret_cast<const float2*>(dqf)[e];
        *reinterpret_cast<uint32_t*>(sDQ + (2 * e / D) * LD + 2 * e % D) = TypeTraits<T>::pack(a.x, a.y);
      }
      cp_async_wait<0>();
      __syncthreads();  // Q^_m, dQ'_m for every warp
      {  // dQ^_m += dQ'_m X_m (this warp's rows qr0.., columns qc0..)
        uint32_t da[KD][4];
        load_a<KD>(da, sDQ, LD, qr0);
        float out[8][4];
        zero(out);
        gemm_nn<T, 8, KD, false>(out, da, sX + qc0, LD);
        add_acc_f32<8>(out, dq + qc0, D, qr0);
      }
      {  // G += Q^_m^T dQ'_m: A(d, row) = Q^[row][d]
        uint32_t qa[KC][4];
        load_a_t<KC>(qa, sQ, LD, xr0);
        gemm_nn<T, NT, KC, false>(gm, qa, sDQ, LD);
      }
      __syncthreads();  // sQ, sDQ are free for the next head
    }
    __syncthreads();  // sX, sE, sG are free for the next chunk
  }
}

}  // namespace pathattn::cuda
