// The softmax backward of one (key chunk, query chunk) tile of the main backward kernels (bwd_main.cuh, mma.sync;
// bwd_main_pair.cuh, wgmma), and the gate's sums of it (docs/math.md Eq. 7, 19-20). Both kernels hold the tile
// transposed in the accumulator layout: rows are the key chunk's (this thread's r0 and r0 + 8), columns the query
// chunk's (nt * 8 + 2 t4 + {0, 1}).
#pragma once

#include "cuda/kernels/bwd_tiles.cuh"

namespace pathattn::cuda::bwd_detail {

// s = S^T (logits, base-2 scaled by scale_log2 here) and dp = (dO V^T)^T in; P^T and dl^T = P^T (dp - delta) out, in
// place (Eq. 19-20, base 2). lse2, delta: per query; gq, gk: the gate cumulated inside the query and key chunks,
// gdelta = goff_m - goff_c (formed in f64 by the caller: docs/spec.md §6). colsum: this thread's key rows' sums
// of dl over the tile's queries (the gate's column sums).
template <bool kGate, int NC8>
__device__ __forceinline__ void softmax_backward(float (&s)[NC8][4], float (&dp)[NC8][4], float scale_log2,
                                                 const float* lse2, const float* delta, const float* gq,
                                                 const float* gk, float gdelta, int r0, float (&colsum)[2]) {
  constexpr float kLog2e = 1.4426950408889634f;
  const int t4 = threadIdx.x % 4;
  colsum[0] = colsum[1] = 0.f;
#pragma unroll
  for (int nt = 0; nt < NC8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qc = nt * 8 + 2 * t4 + e % 2;
      float x = s[nt][e] * scale_log2 - lse2[qc];
      if constexpr (kGate) x += ((gq[qc] + gdelta) - gk[r0 + 8 * (e / 2)]) * kLog2e;
      const float pr = fwd_detail::fast_exp2(x);  // padded query rows: lse2 = +inf, pr = 0
      const float dl = pr * (dp[nt][e] - delta[qc]);
      s[nt][e] = pr;
      dp[nt][e] = dl;
      colsum[e / 2] += dl;
    }
}

// The gate's two sums of the tile's dl (Eq. 7): dG_j -= sum_i dl_ij into dg_keys[C] for this thread's key rows
// (owned by the task), and sum_j dl_ij over this warp's 16 keys into row_sums[4][C] (row warp_row: by default
// the warp's index), which add_gate_rows sums over the 4 warps in a fixed order.
template <int NC8>
__device__ __forceinline__ void gate_tile_sums(const float (&colsum)[2], const float (&dl)[NC8][4], float* dg_keys,
                                               float* row_sums, int r0, int warp_row = threadIdx.x / 32) {
  const int lane = threadIdx.x % 32, t4 = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float x = colsum[half];
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    if (t4 == 0) dg_keys[r0 + 8 * half] -= x;
  }
#pragma unroll
  for (int nt = 0; nt < NC8; ++nt)
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      float x = dl[nt][par] + dl[nt][2 + par];
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (lane < 4) row_sums[warp_row * kChunk + nt * 8 + 2 * lane + par] = x;
    }
}

// dgrow[t] += the 4 warps' row sums of the tile (after a barrier), for the query chunk's `len` rows; in
// deterministic mode inside the dQ^ turn, so the sums across tasks are ordered too.
__device__ __forceinline__ void add_gate_rows(float* dgrow, const float* row_sums, int len) {
  constexpr int C = kChunk;
  const int t = threadIdx.x;
  if (t < len) atomicAdd(dgrow + t, (row_sums[t] + row_sums[C + t]) + (row_sums[2 * C + t] + row_sums[3 * C + t]));
}

// The end of a task: dK^_c = E and dV_c (f32, rows of the key chunk), and the gate's column sums of every query
// head of the group into dgacc (plain stores: the task owns them). A barrier first when kGate (dg_keys was
// written by other threads).
template <bool kGate, int NT>
__device__ __forceinline__ void store_task_gradients(const float (&e_acc)[NT][4], const float (&dv_acc)[NT][4],
                                                     const BwdParams& p, int64_t fac, int gc, int h, int row0,
                                                     const float* sDG) {
  constexpr int C = kChunk, D = NT * 8;
  store_acc_f32<NT>(e_acc, p.dkacc + fac * C * D, D, row0);
  store_acc_f32<NT>(dv_acc, p.dvacc + fac * C * D, D, row0);
  if constexpr (kGate) {
    __syncthreads();
    for (int i = threadIdx.x; i < p.group * C; i += blockDim.x)
      p.dgacc[((int64_t)gc * p.HQ + h * p.group + i / C) * C + i % C] = sDG[i];
  }
}

}  // namespace pathattn::cuda::bwd_detail
