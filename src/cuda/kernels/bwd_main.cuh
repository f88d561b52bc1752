// The main backward kernel: the O(T^2) part of the gradient (docs/math.md Eq. 18-23, 33), key-chunk major as
// FlashAttention's backward, with the keys carried (Eq. 17) instead of the queries.
//
// One task = (key chunk c, kv head h). Persistent CTAs of 4 warps take tasks in list order (plan.cu); warp w owns
// key rows 16w..16w+15 of the chunk.
//   phase 1, m = c+1 .. last:  K~_{c,m} stored to the CTA's slot, then K~ <- K~ + K~ E_m      (Eq. 18, 32)
//   phase 2, m = last .. c+1:  for every query head of the group (GQA inside the CTA):
//        S^T = K~_{c,m} Q^_m^T,  P^T = exp2(S^T - lse),  dl^T = P^T (V_c dO_m^T - delta)         (Eq. 19-20)
//        dV_c += P^T dO_m,  E += ds^T Q^_m,  dQ^_m += ds K~_{c,m}  (cross-CTA, f32 atomics)      (Eq. 5, 21)
//      then back through the carry K~_{c,m} = K~_{c,m-1} P_{m-1}^T:
//        dP_{m-1} += E^T K~_{c,m-1}  (D x D, cross-CTA),   E <- E P_{m-1} = E + E E_{m-1}^T          (Eq. 33)
//   end: dK^_c = E, dV_c, and the gate's column sums -sum_i dl_ij, owned by the task: plain stores; the gate's
//   row sums sum_j dl_ij go with dQ^_m (cross-CTA).
//
// Two-level (p.carry_block = B > 0; docs/math.md Eq. 54-57, cuda/bwd_blocks.h): the task's levels are the chunks
// of c's own block as above, then one level per later block mu, met through K~_{c,s_mu} (its slot entry) with Q'_m
// (p.qfar) for every query chunk m of mu; dQ'_m goes to p.dqfar, and the step from one far level to the next is
// F_mu (p.blockstep) with its gradient dPi_mu into p.dpiacc (turns p.count_pi). With blocks off every level is one
// chunk and the loops below are the per-chunk ones.
//
// Memory stays linear in T: a task keeps its carried copies (at most T x D) in its CTA's slot, and there are as
// many slots as resident CTAs (api.cu), not one per task: fla's backward instead stores the query transformed to
// every 512-token boundary (T^2 / 512 rows).
//
// The cross-CTA sums (dQ^_m over key chunks c < m, dP_j over c < j) are f32 atomics. In deterministic mode each
// (tile, head) has a counter and task c adds after task c + 1 (wait_turn / pass_turn): the order is fixed, so the
// sums round the same way on every run. Task c + 1 reaches a chunk m about one carry step earlier than task c (its
// phase 1 is one step shorter), so the waits are short.
#pragma once

#include "cuda/bwd_blocks.h"
#include "cuda/kernels/bwd_softmax.cuh"

namespace pathattn::cuda {

template <int D>
struct BwdMainSmem {
  static constexpr int C = kChunk;
  static constexpr int LD = D + 8, LDC = C + 8;  // padded rows: conflict-free ldmatrix
  // K~_{c,m}, K~_{c,m-1}, Q^_m, dO_m, E (V_c at the task's start), dS^T [C][LDC], E_step [D][LD]
  static constexpr int kHalves = 5 * C * LD + C * LDC + D * LD;
  static constexpr int kFloats = 8 * C;  // lse2, delta, query gate, key gate, per-warp row sums
  static constexpr int bytes(int group, bool gate) { return kHalves * 2 + (kFloats + (gate ? group * C : 0)) * 4 + 16; }
};

template <typename T, int D, bool kGate, bool kDet>
__global__ void __launch_bounds__(128, D == 64 ? 2 : 1) bwd_main_kernel(const BwdParams p) {
  using namespace fwd_detail;
  using namespace bwd_detail;
  using S = BwdMainSmem<D>;
  constexpr int C = kChunk, LD = S::LD, LDC = S::LDC;
  constexpr int NT = D / 8, KD = D / 16, NC8 = C / 8, KC = C / 16;
  constexpr int NH = D / 64;  // 64-column halves of D-wide products done one at a time (register pressure)

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sKt = reinterpret_cast<T*>(smem_raw);  // [C][LD]  K~_{c,m}
  T* sKp = sKt + C * LD;                    // [C][LD]  K~_{c,m-1}
  T* sQ = sKp + C * LD;                     // [C][LD]  Q^_m of one query head
  T* sdO = sQ + C * LD;                     // [C][LD]  dO_m of that head
  T* sE = sdO + C * LD;                     // [C][LD]  V_c at the start, then E (chain step)
  T* sDS = sE + C * LD;                     // [C][LDC] ds^T: [key][query]
  T* sStep = sDS + C * LDC;                 // [D][LD]  E_j = -U_j^T W_j (Eq. 32)
  float* sLse2 = reinterpret_cast<float*>(sStep + D * LD);  // [C]
  float* sDelta = sLse2 + C;                                // [C]
  float* sGq = sDelta + C;                                  // [C] gate of the query chunk (in-chunk cumsum)
  float* sGk = sGq + C;                                     // [C] gate of the key chunk
  float* sRow = sGk + C;                                    // [4][C] per-warp row sums of dl (kGate)
  float* sDG = sRow + 4 * C;                                // [group][C] gate column sums (kGate)
  __shared__ int s_task;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = warp * 16, r0 = row0 + lane / 4;  // this warp's 16 key rows; this thread's rows r0, r0 + 8
  T* slot = static_cast<T*>(p.slots) + (int64_t)blockIdx.x * p.slot_chunks * C * D;
  const T* khat = static_cast<const T*>(p.ws.khat);
  const T* step = static_cast<const T*>(p.ws.step);
  const T* blockstep = static_cast<const T*>(p.blockstep);
  const T* qhat = static_cast<const T*>(p.qhat);
  const T* qfar = static_cast<const T*>(p.qfar);
  const T* vin = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(p.dout);

  for (;;) {
    const int task = take_task(p, s_task);
    if (task < 0) break;
    const int gc = task / p.H, h = task % p.H;
    const ChunkInfo ci = p.chunks[gc];
    const int last = ci.last;
    const int64_t fac = (int64_t)gc * p.H + h;  // this (chunk, kv head) in the workspace
    const BwdLevels lv = BwdLevels::of(gc, ci.first, last, p.carry_block);
    const int levels = lv.count();
    auto load_step = [&](T* dst, int i) {  // level i's step, E_m or F_mu: D rows, in row blocks of C
      const T* src = lv.is_far(i) ? blockstep + ((int64_t)p.blk_of[lv.unit(i)] * p.H + h) * D * D
                                  : step + ((int64_t)lv.unit(i) * p.H + h) * D * D;
#pragma unroll
      for (int r = 0; r < D; r += C) load_tile<T, D, false>(dst + r * LD, LD, src + r * D, D, C);
    };

    // V_c (as A fragments, kept for the whole task) and K^_c = K~_{c,c+1}.
    load_tile<T, D, false>(sE, LD, vin + ci.b * p.sv.b + (int64_t)ci.t0 * p.sv.t + h * p.sv.h, p.sv.t, ci.len);
    load_tile<T, D, false>(sKt, LD, khat + fac * C * D, D, C);
    cp_async_commit();
    if constexpr (kGate)
      for (int i = threadIdx.x; i < p.group * C; i += blockDim.x) sDG[i] = 0.f;
    cp_async_wait<0>();
    __syncthreads();
    uint32_t va[KD][4];
    load_a<KD>(va, sE, LD, row0);

    // ---- Phase 1: carry K^_c to every level's start, keeping each copy in the slot (Eq. 18, 32, 49). The next
    // step is loaded while this step's product runs: two buffers, sStep and sQ..sdO (free until phase 2; 2 C rows >=
    // D).
    {
      T* const step_buf[2] = {sStep, sQ};
      if (levels > 1) {
        load_step(step_buf[0], 0);
        cp_async_commit();
      }
      float kc[NT][4];
      load_acc<T, NT>(kc, sKt, LD, row0);
      for (int i = 0; i < levels; ++i) {
        store_acc<T, NT>(kc, slot + (int64_t)i * C * D, D, row0);
        if (i + 1 == levels) break;
        __syncthreads();  // every warp is done with the buffer the next load overwrites (step i - 1's)
        if (i + 2 < levels) {
          load_step(step_buf[(i + 1) & 1], i + 1);
          cp_async_commit();
          cp_async_wait<1>();  // step i has landed; step i + 1 may still be in flight
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();
        uint32_t ka[KD][4];
        to_a_frags<T, NT>(kc, ka, 1.f);
        gemm_nn<T, NT, KD, false>(kc, ka, step_buf[i & 1], LD);  // K~ <- K~ + K~ step_i  (K~ P_m^T, K~ Pi_mu^T)
      }
    }

    // ---- Phase 2: levels from the farthest back to the nearest, each level's query chunks from its last.
    float e_acc[NT][4], dv_acc[NT][4];
    zero(e_acc);
    zero(dv_acc);
    // Loads of one query step: Q^_m (a near level) or Q'_m (a far one) and dO_m of query head hq.
    auto load_query = [&](int m, int hq, bool far) {
      const ChunkInfo cq = p.chunks[m];
      load_tile<T, D, false>(sQ, LD, (far ? qfar : qhat) + ((int64_t)m * p.HQ + hq) * C * D, D, C);
      load_tile<T, D, false>(sdO, LD, dout + cq.b * p.sdo.b + (int64_t)cq.t0 * p.sdo.t + hq * p.sdo.h, p.sdo.t, cq.len);
    };
    // The chain step after level i (below) loads K~ of level i - 1, which is the next level's key tile: it lands in
    // sKp and the two pointers swap, and the next level's first Q and dO are loaded during the chain step too.
    bool prefetched = false;
    for (int i = levels - 1; i >= 0; --i) {
      const bool far = lv.is_far(i);
      if (!prefetched) {
        __syncthreads();  // the slot's stores (phase 1) are done
        load_tile<T, D, false>(sKt, LD, slot + (int64_t)i * C * D, D, C);
        cp_async_commit();
      }
      for (int m = lv.query_hi(i); m >= lv.query_lo(i); --m) {
        const ChunkInfo cm = p.chunks[m];
        for (int j = 0; j < p.group; ++j) {
          const int hq = h * p.group + j;
          const int64_t qrow = (int64_t)m * p.HQ + hq;
          if (!(prefetched && j == 0 && m == lv.query_hi(i))) {
            load_query(m, hq, far);
            cp_async_commit();
          }
          if (threadIdx.x < C) {
            sLse2[threadIdx.x] = p.lse2[qrow * C + threadIdx.x];
            sDelta[threadIdx.x] = p.delta[qrow * C + threadIdx.x];
            if constexpr (kGate) {
              sGq[threadIdx.x] = p.ws.gl[qrow * C + threadIdx.x];
              sGk[threadIdx.x] = p.ws.gl[((int64_t)gc * p.HQ + hq) * C + threadIdx.x];
            }
          }
          float gdelta = 0.f;  // G_i - G_j = (goff_m - goff_c) + gl_i - gl_j, the large offsets subtracted in f64
          if constexpr (kGate) gdelta = static_cast<float>(p.ws.goff[qrow] - p.ws.goff[(int64_t)gc * p.HQ + hq]);
          cp_async_wait<0>();
          __syncthreads();

          float s[NC8][4], dp[NC8][4];
          {
            uint32_t ka[KD][4];
            load_a<KD>(ka, sKt, LD, row0);
            zero(s);
            gemm_nt<T, NC8, KD, false>(s, ka, sQ, LD);  // S^T = K~ Q^T: [key][query]
          }
          zero(dp);
          gemm_nt<T, NC8, KD, false>(dp, va, sdO, LD);  // (dO V^T)^T = V dO^T
          float colsum[2];  // this thread's key rows: sum over queries of dl
          softmax_backward<kGate>(s, dp, p.scale_log2, sLse2, sDelta, sGq, sGk, gdelta, r0, colsum);
          if constexpr (kGate) gate_tile_sums(colsum, dp, sDG + j * C, sRow, r0);
          {
            uint32_t pa[KC][4];
            to_a_frags<T, NC8>(s, pa, 1.f);
            gemm_nn<T, NT, KC, false>(dv_acc, pa, sdO, LD);  // dV_c += P^T dO_m (Eq. 5)
            to_a_frags<T, NC8>(dp, pa, p.scale);
            gemm_nn<T, NT, KC, false>(e_acc, pa, sQ, LD);  // E += ds^T Q (Eq. 21)
          }
          store_acc<T, NC8>(dp, sDS, LDC, row0, p.scale);
          __syncthreads();
          // dQ_m += ds K~ (Eq. 21; dQ^_m or dQ'_m): query rows now, A = ds = (ds^T)^T read transposed.
          {
            uint32_t da[KC][4];
            load_a_t<KC>(da, sDS, LDC, row0);
            if constexpr (kDet) wait_turn(p.count_q + qrow, lv.query_turn(m));
            if constexpr (kGate) add_gate_rows(p.dgrow + qrow * C, sRow, cm.len);
            float* dst = (far ? p.dqfar : p.dqacc) + qrow * C * D;
#pragma unroll
            for (int hh = 0; hh < NH; ++hh) {
              float dq[8][4];
              zero(dq);
              gemm_nn<T, 8, KC, false>(dq, da, sKt + hh * 64, LD);
              atomic_add_acc<8>(dq, dst + hh * 64, D, row0, cm.len);
            }
            if constexpr (kDet) pass_turn(p.count_q + qrow);
          }
          __syncthreads();  // sQ, sdO, sDS are free for the next head
        }
      }

      prefetched = false;
      if (i > 0) {
        // Back through level i's start = level i - 1's carried by its step (Eq. 33, 50): dstep_{i-1} += E^T K~_{i-1},
        // E <- E + E step_{i-1}^T.
        const bool far_prev = lv.is_far(i - 1);
        const int u = lv.unit(i - 1);
        load_tile<T, D, false>(sKp, LD, slot + (int64_t)(i - 1) * C * D, D, C);
        load_step(sStep, i - 1);
        cp_async_commit();
        load_query(lv.query_hi(i - 1), h * p.group, far_prev);  // the next level's first query (sQ, sdO are free)
        cp_async_commit();
        prefetched = true;
        store_acc<T, NT>(e_acc, sE, LD, row0);
        cp_async_wait<1>();  // K~ and the step; the query loads may still be in flight
        __syncthreads();
        const int64_t unit_h = (int64_t)(far_prev ? p.blk_of[u] : u) * p.H + h;
        int* count = (far_prev ? p.count_pi : p.count_p) + unit_h;
        if constexpr (kDet) wait_turn(count, lv.step_turn(i - 1));
        float* dst = (far_prev ? p.dpiacc : p.dpacc) + unit_h * D * D;
        for (int rb = warp; rb < D / 16; rb += 4) {  // D x D: row blocks of 16 over the 4 warps
          uint32_t ea[KC][4];
          load_a_t<KC>(ea, sE, LD, rb * 16);  // A(d, key) = E[key][d]
#pragma unroll
          for (int hh = 0; hh < NH; ++hh) {
            float dpj[8][4];
            zero(dpj);
            gemm_nn<T, 8, KC, false>(dpj, ea, sKp + hh * 64, LD);
            atomic_add_acc<8>(dpj, dst + hh * 64, D, rb * 16, D);
          }
        }
        if constexpr (kDet) pass_turn(count);
        uint32_t ea[KD][4];
        to_a_frags<T, NT>(e_acc, ea, 1.f);
        gemm_nt<T, NT, KD, false>(e_acc, ea, sStep, LD);  // E <- E + E step^T
        T* const t = sKt;  // level i - 1's K~ is the next level's key tile
        sKt = sKp;
        sKp = t;
      }
    }

    // ---- The task's own gradients (rows of chunk c; all zero when c is its sequence's last chunk).
    store_task_gradients<kGate>(e_acc, dv_acc, p, fac, gc, h, row0, sDG);
  }
}

}  // namespace pathattn::cuda
