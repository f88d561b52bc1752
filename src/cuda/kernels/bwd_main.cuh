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
// Memory stays linear in T: a task keeps its carried copies (at most T x D) in its CTA's slot, and there are as
// many slots as resident CTAs (api.cu), not one per task: fla's backward instead stores the query transformed to
// every 512-token boundary (T^2 / 512 rows).
//
// The cross-CTA sums (dQ^_m over key chunks c < m, dP_j over c < j) are f32 atomics. In deterministic mode each
// (tile, head) has a counter and task c adds after task c + 1 (wait_turn / pass_turn): the order is fixed, so the
// sums round the same way on every run. Task c + 1 reaches a chunk m about one carry step earlier than task c (its
// phase 1 is one step shorter), so the waits are short.
#pragma once

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
  const T* qhat = static_cast<const T*>(p.qhat);
  const T* vin = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(p.dout);

  for (;;) {
    const int task = take_task(p, s_task);
    if (task < 0) break;
    const int gc = task / p.H, h = task % p.H;
    const ChunkInfo ci = p.chunks[gc];
    const int last = ci.last;
    const int64_t fac = (int64_t)gc * p.H + h;  // this (chunk, kv head) in the workspace
    auto load_step = [&](T* dst, int chunk) {  // E_chunk, D rows, in row blocks of C
      const T* src = step + ((int64_t)chunk * p.H + h) * D * D;
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

    // ---- Phase 1: carry K^_c to every later chunk start, keeping each copy in the slot (Eq. 18, 32). The next
    // step's E_m is loaded while this step's product runs: two buffers, sStep and sQ..sdO (free until phase 2;
    // 2 C rows >= D).
    {
      T* const step_buf[2] = {sStep, sQ};
      if (gc + 1 < last) {
        load_step(step_buf[0], gc + 1);
        cp_async_commit();
      }
      float kc[NT][4];
      load_acc<T, NT>(kc, sKt, LD, row0);
      for (int m = gc + 1; m <= last; ++m) {
        store_acc<T, NT>(kc, slot + (int64_t)(m - gc - 1) * C * D, D, row0);
        if (m == last) break;
        __syncthreads();  // every warp is done with the buffer the next load overwrites (step m - 1's)
        if (m + 1 < last) {
          load_step(step_buf[(m - gc) & 1], m + 1);
          cp_async_commit();
          cp_async_wait<1>();  // E_m has landed; E_{m+1} may still be in flight
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();
        uint32_t ka[KD][4];
        to_a_frags<T, NT>(kc, ka, 1.f);
        gemm_nn<T, NT, KD, false>(kc, ka, step_buf[(m - gc - 1) & 1], LD);  // K~ <- K~ + K~ E_m  (K~ P_m^T)
      }
    }

    // ---- Phase 2: query chunks from the last back to c + 1.
    float e_acc[NT][4], dv_acc[NT][4];
    zero(e_acc);
    zero(dv_acc);
    // Loads of one query step: Q^_m and dO_m of query head hq.
    auto load_query = [&](int m, int hq) {
      const ChunkInfo cq = p.chunks[m];
      load_tile<T, D, false>(sQ, LD, qhat + ((int64_t)m * p.HQ + hq) * C * D, D, C);
      load_tile<T, D, false>(sdO, LD, dout + cq.b * p.sdo.b + (int64_t)cq.t0 * p.sdo.t + hq * p.sdo.h, p.sdo.t, cq.len);
    };
    // The chain step of query chunk m (below) loads K~_{c,m-1}, which is the next step's K~_{c,m}: it lands in sKp
    // and the two pointers swap, and the next step's first Q^ and dO are loaded during the chain step too.
    bool prefetched = false;
    for (int m = last; m > gc; --m) {
      const ChunkInfo cm = p.chunks[m];
      if (!prefetched) {
        __syncthreads();  // the slot's stores (phase 1) are done
        load_tile<T, D, false>(sKt, LD, slot + (int64_t)(m - gc - 1) * C * D, D, C);
        cp_async_commit();
      }
      for (int j = 0; j < p.group; ++j) {
        const int hq = h * p.group + j;
        const int64_t qrow = (int64_t)m * p.HQ + hq;
        if (!(prefetched && j == 0)) {
          load_query(m, hq);
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
          gemm_nt<T, NC8, KD, false>(s, ka, sQ, LD);  // S^T = K~ Q^^T: [key][query]
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
          gemm_nn<T, NT, KC, false>(e_acc, pa, sQ, LD);  // E += ds^T Q^_m (Eq. 21)
        }
        store_acc<T, NC8>(dp, sDS, LDC, row0, p.scale);
        __syncthreads();
        // dQ^_m += ds K~_{c,m} (Eq. 21): query rows now, A = ds = (ds^T)^T read transposed.
        {
          uint32_t da[KC][4];
          load_a_t<KC>(da, sDS, LDC, row0);
          if constexpr (kDet) wait_turn(p.count_q + qrow, m - 1 - gc);
          if constexpr (kGate) add_gate_rows(p.dgrow + qrow * C, sRow, cm.len);
          float* dst = p.dqacc + qrow * C * D;
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

      prefetched = false;
      if (m > gc + 1) {
        // Back through K~_{c,m} = K~_{c,m-1} P_{m-1}^T (Eq. 33): dP_{m-1} += E^T K~_{c,m-1}, E <- E P_{m-1}.
        const int j = m - 1;
        load_tile<T, D, false>(sKp, LD, slot + (int64_t)(j - gc - 1) * C * D, D, C);
        load_step(sStep, j);
        cp_async_commit();
        load_query(j, h * p.group);  // the next step's first head (sQ, sdO are free: the barrier above)
        cp_async_commit();
        prefetched = true;
        store_acc<T, NT>(e_acc, sE, LD, row0);
        cp_async_wait<1>();  // K~_{c,m-1} and E_{m-1}; the query loads may still be in flight
        __syncthreads();
        int* count = p.count_p + (int64_t)j * p.H + h;
        if constexpr (kDet) wait_turn(count, j - 1 - gc);
        float* dst = p.dpacc + ((int64_t)j * p.H + h) * D * D;
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
        gemm_nt<T, NT, KD, false>(e_acc, ea, sStep, LD);  // E <- E + E E_j^T
        T* const t = sKt;  // K~_{c,m-1} is the next step's K~_{c,m}
        sKt = sKp;
        sKp = t;
      }
    }

    // ---- The task's own gradients (rows of chunk c; all zero when c is its sequence's last chunk).
    store_task_gradients<kGate>(e_acc, dv_acc, p, fac, gc, h, row0, sDG);
  }
}

}  // namespace pathattn::cuda
