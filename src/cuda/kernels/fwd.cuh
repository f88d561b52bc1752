// The main forward kernel: FlashAttention-2 over chunks with the query carried right to left
// (docs/math.md Eq. 12, 13, 15, 16). One CTA of 4 warps per (query chunk m, query head); warp w owns the
// chunk's query rows 16w..16w+15. Tensor cores through mma.sync m16n8k16 (HMMA), f32 accumulation.
//
//   diagonal:  S = lower(Q K^T) - lower(Q W^T) M          (Eq. 12, M = T b strict_lower(W K^T) from prep)
//              Q~ = Q - lower(Q W^T) U                     (Eq. 13: the query carried to the chunk start)
//   c = m-1 .. first:  S = Q~ K^_c^T                       (Eq. 15)
//                      Q~ <- Q~ + Q~ E_c^T,  E_c = -U_c^T W_c from prep   (Eq. 32: one D x D product instead
//                                                          of the two C x D ones of Eq. 16)
//   with FlashAttention's online softmax in base 2 over all S, O += P V_c.
//
// Q~ stays in f32 registers (accumulator layout); it becomes a bf16/f16 A operand for each product (docs/spec.md §6).
// Key chunks stream through two shared-memory stages with cp.async: chunk c-1 loads while chunk c computes.
#pragma once

#include "cuda/kernels/fwd_tiles.cuh"

namespace pathattn::cuda {

// Shared-memory tiles are rows padded by 16 bytes (8 elements), so that the 8 rows one ldmatrix phase reads land on
// 8 distinct bank groups. Only D = 128 runs this kernel (D = 64 has the wgmma kernel, fwd_wgmma.cuh): one CTA
// per SM (137 KB); the XOR swizzle the D = 64 version used cost this register-bound variant spills (measured
// 26.3 -> 28.3 ms at 32 x 4096, docs/perf/notes.md).
template <int D>
struct FwdSmem {
  static_assert(D == 128, "the mma.sync forward serves D = 128; D = 64 runs fwd_wgmma_kernel");
  static constexpr int C = kChunk;
  static constexpr bool kSwizzle = false;
  static constexpr int LD = D + 8;
  static constexpr int LDM = C + 8;
  static constexpr int kMat = C * LD;  // elements of one C x D tile
  static constexpr int kStage = 4 * kMat;  // K (or K^), V, then W, U (diagonal) or E (D x D: 128 rows)
  static constexpr int kHalves = 2 * kStage + C * LDM;
  static constexpr int kBytes = kHalves * 2 + 3 * C * 4;  // + gate: query chunk, two key stages
};

template <typename T, int D, bool kGate>
__global__ void __launch_bounds__(128, 1) fwd_kernel(FwdParams p) {
  using namespace fwd_detail;
  using S = FwdSmem<D>;
  constexpr int C = kChunk, LD = S::LD, LDM = S::LDM;
  constexpr bool SW = S::kSwizzle;
  constexpr int NT = D / 8;   // n tiles over the head dimension
  constexpr int KD = D / 16;  // k blocks over the head dimension
  constexpr int NC8 = C / 8;  // n tiles over a key chunk
  constexpr int KC = C / 16;  // k blocks over a key chunk
  constexpr float kLog2e = 1.4426950408889634f;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sm = reinterpret_cast<T*>(smem_raw);
  T* sM = sm + 2 * S::kStage;                                     // [C][LDM]
  float* sGq = reinterpret_cast<float*>(sm + S::kHalves);         // [C]   gate of the query chunk
  float* sGk = sGq + C;                                           // [2][C] gate of the key chunk per stage
  // 0 K, 1 V, 2 W, 3 U; E (D = 128 rows) starts at 2 and runs into 3.
  auto stage = [&](int s, int which) { return sm + s * S::kStage + which * S::kMat; };

  const CtaWork work = cta_work(p);
  const int h = work.h, hq = work.hq, gc = work.gc;
  const ChunkInfo ci = p.chunks[gc];
  const int first = ci.first;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int r0 = warp * 16 + g;  // this thread's two query rows in the chunk: r0, r0 + 8

  const T* wsK = static_cast<const T*>(p.ws.khat);
  const T* wsW = static_cast<const T*>(p.ws.w);
  const T* wsU = static_cast<const T*>(p.ws.u);
  const T* wsE = static_cast<const T*>(p.ws.step);
  const T* vin = static_cast<const T*>(p.v);

  auto ws_tile = [&](const T* base, int chunk) { return base + ((int64_t)chunk * p.H + h) * C * D; };
  auto issue_chunk = [&](int s, int chunk) {  // K^, V, E of an earlier (full) chunk
    const ChunkInfo cc = p.chunks[chunk];
    load_tile<T, D, SW>(stage(s, 0), LD, ws_tile(wsK, chunk), D, C);
    load_tile<T, D, SW>(stage(s, 1), LD, vin + cc.b * p.sv.b + (int64_t)cc.t0 * p.sv.t + h * p.sv.h, p.sv.t, cc.len);
    const T* e = wsE + ((int64_t)chunk * p.H + h) * D * D;
#pragma unroll
    for (int r0 = 0; r0 < D; r0 += C) load_tile<T, D, SW>(stage(s, 2 + r0 / C), LD, e + r0 * D, D, C);
    if constexpr (kGate) {
      if (threadIdx.x < C / 4) cp_async16(sGk + s * C + threadIdx.x * 4, p.ws.gl + ((int64_t)chunk * p.HQ + hq) * C + threadIdx.x * 4, 16);
    }
    cp_async_commit();
  };

  // Prologue: the diagonal chunk's raw K, V, W, U, M (stage 0), then the next key chunk (stage 1).
  {
    const T* kin = static_cast<const T*>(p.k) + ci.b * p.sk.b + (int64_t)ci.t0 * p.sk.t + h * p.sk.h;
    load_tile<T, D, SW>(stage(0, 0), LD, kin, p.sk.t, ci.len);
    load_tile<T, D, SW>(stage(0, 1), LD, vin + ci.b * p.sv.b + (int64_t)ci.t0 * p.sv.t + h * p.sv.h, p.sv.t, ci.len);
    load_tile<T, D, SW>(stage(0, 2), LD, ws_tile(wsW, gc), D, C);
    load_tile<T, D, SW>(stage(0, 3), LD, ws_tile(wsU, gc), D, C);
    load_tile<T, C, SW>(sM, LDM, static_cast<const T*>(p.ws.m) + ((int64_t)gc * p.H + h) * C * C, C, C);
    if constexpr (kGate) {
      if (threadIdx.x < C / 4) {
        const float* src = p.ws.gl + ((int64_t)gc * p.HQ + hq) * C + threadIdx.x * 4;
        cp_async16(sGq + threadIdx.x * 4, src, 16);  // the diagonal's keys share the query chunk's gate
      }
    }
    cp_async_commit();
  }
  if (gc > first) issue_chunk(1, gc - 1);

  // The query rows in f32, accumulator layout [16 x D] per warp (rows past the chunk's end are zero).
  float qf[NT][4];
  load_query_rows<T, NT>(qf, static_cast<const T*>(p.q) + ci.b * p.sq.b + (int64_t)ci.t0 * p.sq.t + hq * p.sq.h, p.sq.t,
                         r0, ci.len);

  float o[NT][4];
  zero(o);
  OnlineSoftmax sm_state;
  const float sl2 = p.scale_log2;

  // Online softmax of one block of logits s (already in base 2), then O += P V.
  auto softmax_pv = [&](float (&s)[NC8][4], const T* sV) {
    sm_state.step(s, o);
    uint32_t pa[KC][4];
    to_a_frags<T, NC8>(s, pa, 1.f);
    gemm_nn<T, NT, KC, SW>(o, pa, sV, LD);
  };

  if (gc > first) cp_async_wait<1>(); else cp_async_wait<0>();
  __syncthreads();

  // ---- Diagonal chunk (Eq. 12, 13).
  diagonal_block<T, D, SW, kGate>(qf, o, sm_state, stage(0, 0), stage(0, 2), stage(0, 3), sM, stage(0, 1), LD, LDM, sGq,
                                  sl2, r0);

  // ---- Earlier chunks, right to left (Eq. 15, 16).
  const QueryGate<kGate> qgate(p, gc, hq, sGq, r0);
  int st = 1;
  for (int c = gc - 1; c >= first; --c, st ^= 1) {
    cp_async_wait<0>();
    __syncthreads();  // stage st is loaded, and every warp is done with stage st ^ 1
    if (c > first) issue_chunk(st ^ 1, c - 1);

    uint32_t qa[KD][4];
    to_a_frags<T, NT>(qf, qa, 1.f);
    float s[NC8][4];
    zero(s);
    gemm_nt<T, NC8, KD, SW>(s, qa, stage(st, 0), LD);  // Q~ K^_c^T
    float delta = 0.f;
    if constexpr (kGate) delta = static_cast<float>(qgate.goff - p.ws.goff[(int64_t)c * p.HQ + hq]);
#pragma unroll
    for (int nt = 0; nt < NC8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float l = s[nt][e] * sl2;
        if constexpr (kGate) {
          const int j = nt * 8 + 2 * t4 + e % 2;
          l += ((qgate.g[e / 2] + delta) - sGk[st * C + j]) * kLog2e;
        }
        s[nt][e] = l;
      }
    softmax_pv(s, stage(st, 1));
    if (c > first)  // Q~ <- Q~ + Q~ E_c^T (Eq. 32): not needed after the sequence's first chunk
      gemm_nt<T, NT, KD, SW>(qf, qa, stage(st, 2), LD);
  }

  // ---- Epilogue: O / l and lse.
  sm_state.finish<T, NT>(o, static_cast<T*>(p.o) + ci.b * p.so.b + (int64_t)ci.t0 * p.so.t + hq * p.so.h, p.so.t,
                         p.lse + ci.b * p.slse.b + (int64_t)ci.t0 * p.slse.t + hq * p.slse.h, p.slse.t, r0, ci.len);
}

}  // namespace pathattn::cuda
