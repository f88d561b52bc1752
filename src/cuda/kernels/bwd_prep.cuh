// Backward preprocess, per (query chunk, query head): what the main backward kernel reads for every pair it visits
// (docs/math.md Eq. 13, 6), computed once instead of once per key chunk:
//   Q^ = Q - lower(Q W^T) U      the query carried to its chunk start (Eq. 13), tensor-core dtype
//   lse2 = lse log2(e)           softmax statistics in base 2 (exp2 in the kernels); +inf on padded rows (p = 0)
//   delta = dO . o - dlse        (Eq. 6); 0 on padded rows
//   dO^ = dO in a [C, D] tile per (chunk, head), zero rows past the chunk's end (when p.dohat is set): the wgmma
//                                main kernel loads it by TMA as a plain 2-D box, whatever dout's strides and
//                                alignment, and never reads another sequence's rows in a short chunk
// One CTA of 4 warps; warp w owns rows 16w..16w+15 (fwd_tiles.cuh's layout: rows r0 and r0 + 8 per thread).
#pragma once

#include "cuda/kernels/fwd_tiles.cuh"

namespace pathattn::cuda {

template <int D>
struct BwdPrepSmem {
  static constexpr int LD = D + 8;  // padded rows: ldmatrix phases hit distinct banks
  static constexpr int kBytes = 2 * kChunk * LD * 2;  // W, U
};

template <typename T, int D>
__global__ void __launch_bounds__(128) bwd_prep_kernel(const BwdParams p) {
  using namespace fwd_detail;
  constexpr int C = kChunk, LD = BwdPrepSmem<D>::LD, NT = D / 8, NC8 = C / 8, KC = C / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sW = reinterpret_cast<T*>(smem_raw);  // [C][LD]
  T* sU = sW + C * LD;                     // [C][LD]

  const int gc = blockIdx.x, hq = blockIdx.y, h = hq / p.group;
  const ChunkInfo ci = p.chunks[gc];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane % 4;
  const int r0 = warp * 16 + lane / 4;
  const int64_t fac = ((int64_t)gc * p.H + h) * C * D;
  load_tile<T, D, false>(sW, LD, static_cast<const T*>(p.ws.w) + fac, D, C);
  load_tile<T, D, false>(sU, LD, static_cast<const T*>(p.ws.u) + fac, D, C);
  cp_async_commit();

  float qf[NT][4];
  load_query_rows<T, NT>(qf, static_cast<const T*>(p.q) + ci.b * p.sq.b + (int64_t)ci.t0 * p.sq.t + hq * p.sq.h, p.sq.t,
                         r0, ci.len);
  cp_async_wait<0>();
  __syncthreads();

  // Q^ = Q - lower(Q W^T) U (Eq. 13), as the forward's diagonal block forms it.
  uint32_t qa[D / 16][4];
  to_a_frags<T, NT>(qf, qa, 1.f);
  float x[NC8][4];
  zero(x);
  gemm_nt<T, NC8, D / 16, false>(x, qa, sW, LD);
#pragma unroll
  for (int nt = 0; nt < NC8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (nt * 8 + 2 * t4 + e % 2 > r0 + 8 * (e / 2)) x[nt][e] = 0.f;
  uint32_t xa[KC][4];
  to_a_frags<T, NC8>(x, xa, -1.f);
  gemm_nn<T, NT, KC, false>(qf, xa, sU, LD);
  T* qh = static_cast<T*>(p.qhat) + ((int64_t)gc * p.HQ + hq) * C * D;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + 8 * half;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)  // rows past the chunk's end: Q was loaded as 0, so Q^ is 0
      *reinterpret_cast<uint32_t*>(qh + r * D + nt * 8 + 2 * t4) = TypeTraits<T>::pack(qf[nt][2 * half], qf[nt][2 * half + 1]);
  }

  if (p.dohat) {  // 4-byte pieces: dout rows need only be 4-byte aligned (api.cu)
    const T* dout = static_cast<const T*>(p.dout) + ci.b * p.sdo.b + (int64_t)ci.t0 * p.sdo.t + hq * p.sdo.h;
    uint32_t* dst = reinterpret_cast<uint32_t*>(static_cast<T*>(p.dohat) + ((int64_t)gc * p.HQ + hq) * C * D);
    for (int e = threadIdx.x; e < C * D / 2; e += blockDim.x) {
      const int r = e / (D / 2), c = 2 * (e % (D / 2));
      dst[e] = r < ci.len ? *reinterpret_cast<const uint32_t*>(dout + r * p.sdo.t + c) : 0u;
    }
  }

  // lse2 and delta: two threads per row, each half of the row, summed with one shuffle.
  {
    const int r = threadIdx.x / 2, part = threadIdx.x % 2;
    const int64_t row = ((int64_t)gc * p.HQ + hq) * C + r;
    float acc = 0.f;
    if (r < ci.len) {
      const int64_t t = ci.t0 + r;
      const T* o = static_cast<const T*>(p.o) + ci.b * p.so.b + t * p.so.t + hq * p.so.h;
      const T* dout = static_cast<const T*>(p.dout) + ci.b * p.sdo.b + t * p.sdo.t + hq * p.sdo.h;
      for (int d = part * (D / 2); d < (part + 1) * (D / 2); d += 2) {
        const float2 a = TypeTraits<T>::unpack(*reinterpret_cast<const uint32_t*>(o + d));
        const float2 b = TypeTraits<T>::unpack(*reinterpret_cast<const uint32_t*>(dout + d));
        acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
      }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (part == 0) {
      if (r < ci.len) {
        const int64_t t = ci.t0 + r;
        const float dl = p.dlse ? p.dlse[ci.b * p.sdlse.b + t * p.sdlse.t + hq * p.sdlse.h] : 0.f;
        p.delta[row] = acc - dl;
        p.lse2[row] = p.lse[ci.b * p.slse.b + t * p.slse.t + hq * p.slse.h] * 1.4426950408889634f;
      } else {
        p.delta[row] = 0.f;
        p.lse2[row] = INFINITY;
      }
    }
  }
}

}  // namespace pathattn::cuda
