// The main backward kernel at D = 64 on Hopper's warpgroup tensor cores (wgmma, sm_90a) and the bulk copy engine
// (TMA). Same math, tasks and summation order as bwd_main.cuh (docs/math.md Eq. 18-23, 33; docs/cuda.md
// "Backward"); only the products and the loads change. One task = (key chunk c, kv head h); one CTA = one
// warpgroup of 4 warps, warp w owning key rows 16w..16w+15; persistent CTAs take tasks in list order.
//
//   phase 1, m = c+1 .. last:  K~_{c,m} -> slot;  K~ <- K~ + K~ E_m                 1 wgmma product (B = E_m, MN-major)
//   phase 2, m = last .. c+1, every query head of the group:
//        S^T = K~ Q^^T,  dP^T = V dO^T                                              2 products (B K-major)
//        P^T, dS^T (softmax backward, Eq. 19-20)
//        dV += P^T dO,  E += dS^T Q^                                                2 products (B MN-major)
//        dQ^_m += dS K~   (dS^T through shared memory, ldmatrix.trans)              1 product, f32 atomics
//      chain:  dP_{m-1} += E^T K~_{c,m-1}  (E through shared memory)                1 product, f32 atomics
//              E <- E + E E_{m-1}^T                                                 1 product (B K-major)
//
// Every product is m64n64k16 x 4 with A from registers (the accumulator layout per warp is mma.sync's, so results
// become A operands in place, and ldmatrix gives the transposed ones) and B from a 128-byte-swizzled shared tile
// (wgmma.cuh). Why: the mma.sync kernel (bwd_main.cuh) reads each B tile once per warp through ldmatrix (4x per
// CTA) and issues ~5x more instructions per product; the forward gained 2.5x from the same change (notes.md v5).
// Measured (notes.md, backward v4): only 1.1-1.2x here, since half of the fast mode's time is the two f32 atomic
// streams (dQ^, dP) and the deterministic turns add as much again; the products themselves run at ~390 TFLOP/s.
//
// Loads: Q^ and dO^ (bwd_prep's padded chunk tiles, so rows past a chunk's end are zeros and every tile is a
// plain 2-D box), lse2, delta and the gate rows of the next (query chunk, head) step go by TMA into the other of
// two stages while the current step computes; K~_{c,m-1} (the CTA's slot) and E_{m-1} for the chain step are
// issued at the start of step m. One thread issues every copy; each completes on an mbarrier.
#pragma once

#include "cuda/kernels/bwd_softmax.cuh"
#include "cuda/kernels/tma.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace pathattn::cuda {

// Shared memory (D = 64): eight swizzled 64 x 64 tiles of 16-bit elements (8 KB, 1024-byte aligned):
//   0, 1: K~ (current, next)    2 + 2s: Q^ of stage s    3 + 2s: dO^ of stage s    6, 7: E steps
// then two padded tiles [C][LDP] read by ldmatrix only (ds^T; V at the task's start, then E for the chain step),
// then floats and the mbarriers, then (kBulk only) the f32 staging tile [C][kStageLd] of the bulk additions.
struct BwdWgSmem {
  static constexpr int C = kChunk, LDP = 64 + 8;
  static constexpr int kTile = C * 64;
  static constexpr int kSwzHalves = 8 * kTile;
  static constexpr int kPadHalves = 2 * C * LDP;
  // per stage: lse2, delta, query gate, key gate [C] each; then per-warp row sums [4][C]
  static constexpr int kFloats = 2 * 4 * C + 4 * C;
  static constexpr int kStageLd = 64 + 8;  // float2 stores of a warp's 8 rows x 4 lanes land on distinct banks
  static constexpr int kStageBytes = C * kStageLd * 4 + 16;  // + 16: alignment of the bulk source
  static constexpr int bytes(int group, bool gate, bool bulk_reduce) {
    return 1024 + (kSwzHalves + kPadHalves) * 2 + (kFloats + (gate ? group * C : 0)) * 4 + 6 * 8 +
           (bulk_reduce ? kStageBytes : 0);
  }
};

namespace bwd_detail {
// The bulk path of the dQ^ and dP additions (the kernel's kBulk: the fast mode's default, launch/bwd_impl.cuh
// bulk_reduce_for): why, docs/perf/notes.md (v4: the two f32 atomic streams are half of the fast mode's time). A 64 x 64
// f32 accumulator tile (mma layout, this warp's 16 rows) into the staging tile; ends with a barrier, so that
// bulk_add_rows may follow. Each thread r < C first waits until the copy engine has read the row it added last.
__device__ __forceinline__ void stage_acc(const float (&acc)[8][4], float* stage, int row0) {
  constexpr int LD = BwdWgSmem::kStageLd;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  if (threadIdx.x < kChunk) bulk_wait_read();
  __syncthreads();
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    *reinterpret_cast<float2*>(stage + (row0 + g) * LD + nt * 8 + 2 * t) = make_float2(acc[nt][0], acc[nt][1]);
    *reinterpret_cast<float2*>(stage + (row0 + g + 8) * LD + nt * 8 + 2 * t) = make_float2(acc[nt][2], acc[nt][3]);
  }
  fence_proxy_async_smem();  // the stores, before the copy engine reads them
  __syncthreads();
}
// g0[r][0..64) += stage[r] for r < rows (row stride 64 floats in global memory): thread r issues row r's 256-byte
// bulk reduction. kDet (inside the ordered turn): the previous turn's additions are ordered before these, and
// these complete before the turn passes (pass_turn's fence then publishes them).
template <bool kDet>
__device__ __forceinline__ void bulk_add_rows(const float* stage, float* g0, int rows) {
  if (threadIdx.x < rows) {
    if constexpr (kDet) fence_proxy_async_global();
    bulk_reduce_add_f32(g0 + threadIdx.x * 64, smem_addr(stage + threadIdx.x * BwdWgSmem::kStageLd), 64 * 4);
    bulk_commit();
    if constexpr (kDet) {
      bulk_wait();
      fence_proxy_async_global();
    }
  }
}
}  // namespace bwd_detail

// kBulk: the dQ^ / dP additions by bulk reductions (stage_acc, bulk_add_rows above) instead of f32 atomics.
template <typename T, bool kGate, bool kDet, bool kBulk>
__global__ void __launch_bounds__(128, 2)
    bwd_main_wgmma_kernel(const BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                          const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_step,
                          const __grid_constant__ CUtensorMap tm_slot) {
  using namespace fwd_detail;
  using namespace bwd_detail;
  using S = BwdWgSmem;
  constexpr int D = 64, C = kChunk, LDP = S::LDP;
  constexpr int NT = D / 8, KD = D / 16, NC8 = C / 8, KC = C / 16;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  T* sm = reinterpret_cast<T*>(smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u));
  auto tile = [&](int i) { return sm + i * S::kTile; };
  T* sDS = sm + S::kSwzHalves;  // [C][LDP] ds^T: [key][query]
  T* sEs = sDS + C * LDP;       // [C][LDP] V_c at the task's start, then E (chain step)
  float* fl = reinterpret_cast<float*>(sEs + C * LDP);
  auto sLse2 = [&](int s) { return fl + s * 4 * C; };
  auto sDelta = [&](int s) { return fl + s * 4 * C + C; };
  auto sGq = [&](int s) { return fl + s * 4 * C + 2 * C; };
  auto sGk = [&](int s) { return fl + s * 4 * C + 3 * C; };
  float* sRow = fl + 8 * C;    // [4][C] per-warp row sums of dl (kGate)
  float* sDG = sRow + 4 * C;   // [group][C] gate column sums (kGate)
  const uint32_t bar0 = smem_addr(sDG + (kGate ? p.group * C : 0));
  // mbarriers: 0, 1 query stages; 2 chain (K~_{c,m-1}, E_{m-1}; K~_{c,last} at phase 2's start); 3, 4 phase 1 steps
  auto bar = [&](int i) { return bar0 + 8 * i; };
  // The staging tile of the bulk additions (kBulk), 16-byte aligned after the mbarriers.
  float* sStage = reinterpret_cast<float*>(
      (reinterpret_cast<uintptr_t>(sDG + (kGate ? p.group * C : 0)) + 6 * 8 + 15) & ~static_cast<uintptr_t>(15));
  __shared__ int s_task;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = warp * 16, r0 = row0 + lane / 4;  // this warp's 16 key rows; this thread's rows r0, r0 + 8
  T* slot = static_cast<T*>(p.slots) + (int64_t)blockIdx.x * p.slot_chunks * C * D;
  const int slot_row0 = blockIdx.x * p.slot_chunks * C;  // the slot's first row in tm_slot
  const T* khat = static_cast<const T*>(p.ws.khat);
  const T* vin = static_cast<const T*>(p.v);

  if (threadIdx.x == 0) {
    for (int i = 0; i < 5; ++i) mbar_init(bar(i), 1);
    mbar_fence_init();
  }
  uint32_t phase = 0;  // bit i: parity of barrier i's next completion
  auto wait_bar = [&](int i) {
    mbar_wait(bar(i), (phase >> i) & 1);
    phase ^= 1u << i;
  };
  // Issued by thread 0 only.
  auto issue_step = [&](int i, int dst_tile, int chunk, int h) {  // E_chunk (D x D) into a tile
    mbar_arrive_expect_tx(bar(i), S::kTile * 2);
    tma_load_2d(smem_addr(tile(dst_tile)), &tm_step, 0, (chunk * p.H + h) * D, bar(i));
  };
  auto issue_query = [&](int s, int m, int hq, int gc) {  // stage s <- step (query chunk m, head hq)
    const int64_t qrow = (int64_t)m * p.HQ + hq;
    mbar_arrive_expect_tx(bar(s), 2 * S::kTile * 2 + 2 * C * 4 + (kGate ? 2 * C * 4 : 0));
    tma_load_2d(smem_addr(tile(2 + 2 * s)), &tm_q, 0, static_cast<int>(qrow * C), bar(s));
    tma_load_2d(smem_addr(tile(3 + 2 * s)), &tm_do, 0, static_cast<int>(qrow * C), bar(s));
    bulk_load(smem_addr(sLse2(s)), p.lse2 + qrow * C, C * 4, bar(s));
    bulk_load(smem_addr(sDelta(s)), p.delta + qrow * C, C * 4, bar(s));
    if constexpr (kGate) {
      bulk_load(smem_addr(sGq(s)), p.ws.gl + qrow * C, C * 4, bar(s));
      bulk_load(smem_addr(sGk(s)), p.ws.gl + ((int64_t)gc * p.HQ + hq) * C, C * 4, bar(s));
    }
  };
  __syncthreads();

  for (;;) {
    const int task = take_task(p, s_task);
    if (task < 0) break;
    const int gc = task / p.H, h = task % p.H;
    const ChunkInfo ci = p.chunks[gc];
    const int last = ci.last;
    const int64_t fac = (int64_t)gc * p.H + h;  // this (chunk, kv head) in the workspace

    // V_c (A fragments for the whole task) through the padded tile; K^_c = K~_{c,c+1} into f32 registers.
    load_tile<T, D, false>(sEs, LDP, vin + ci.b * p.sv.b + (int64_t)ci.t0 * p.sv.t + h * p.sv.h, p.sv.t, ci.len);
    cp_async_commit();
    if (threadIdx.x == 0 && gc + 1 < last) {
      fence_proxy_async_smem();
      issue_step(3, 6, gc + 1, h);
    }
    if constexpr (kGate)
      for (int i = threadIdx.x; i < p.group * C; i += blockDim.x) sDG[i] = 0.f;
    float kc[NT][4];
    load_acc<T, NT>(kc, khat + fac * C * D, D, row0);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t va[KD][4];
    load_a<KD>(va, sEs, LDP, row0);

    // ---- Phase 1: carry K^_c to every later chunk start, keeping each copy in the slot (Eq. 18, 32); the next
    // step's E_{m+1} is loaded while this step's product runs (tiles 6, 7; barriers 3, 4).
    for (int m = gc + 1; m <= last; ++m) {
      store_acc<T, NT>(kc, slot + (int64_t)(m - gc - 1) * C * D, D, row0);
      if (m == last) break;
      const int b = (m - gc - 1) & 1;
      __syncthreads();  // every thread is done with tile 6 + (b ^ 1) (step m - 1's product waited)
      if (threadIdx.x == 0 && m + 1 < last) {
        fence_proxy_async_smem();
        issue_step(3 + (b ^ 1), 6 + (b ^ 1), m + 1, h);
      }
      wait_bar(3 + b);
      uint32_t ka[KD][4];
      to_a_frags<T, NT>(kc, ka, 1.f);
      wgmma_fence_operand(kc);
      wgmma_fence();
      if (!(p.timing_skip & 4)) wgmma_k64<1>(kc, ka, tile(6 + b), true);  // K~ <- K~ + K~ E_m  (K~ P_m^T)
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(kc);
    }
    // The slot's rows were written by ordinary stores; the copy engine reads them next (phase 2).
    fence_proxy_async_global();
    __syncthreads();

    // ---- Phase 2: query chunks from the last back to c + 1, every query head of the group in turn.
    float e_acc[NT][4], dv_acc[NT][4];
    zero(e_acc);
    zero(dv_acc);
    int kt = 0;  // tile holding K~_{c,m}
    if (threadIdx.x == 0 && last > gc) {  // (a sequence's last chunk has no later query chunk: no phase 2)
      fence_proxy_async_smem();  // the previous task's ldmatrix reads of tile 0, before the copy engine's writes
      mbar_arrive_expect_tx(bar(2), S::kTile * 2);
      tma_load_2d(smem_addr(tile(0)), &tm_slot, 0, slot_row0 + (last - gc - 1) * C, bar(2));
      issue_query(0, last, h * p.group, gc);
    }
    int it = 0;  // (query chunk, head) steps so far: the stage is it & 1
    for (int m = last; m > gc; --m) {
      const ChunkInfo cm = p.chunks[m];
      if (m == last) wait_bar(2);
      uint32_t ka[KD][4];  // K~_{c,m} as A fragments, for every head of the group
      for (int j = 0; j < p.group; ++j, ++it) {
        const int st = it & 1;
        const int hq = h * p.group + j;
        const int64_t qrow = (int64_t)m * p.HQ + hq;
        __syncthreads();  // every thread is done with stage st ^ 1 (the previous step), sDS and sRow
        if (threadIdx.x == 0) {
          fence_proxy_async_smem();
          if (j + 1 < p.group)
            issue_query(st ^ 1, m, hq + 1, gc);
          else if (m - 1 > gc)
            issue_query(st ^ 1, m - 1, h * p.group, gc);
          if (j == 0 && m - 1 > gc) {  // the chain step's K~_{c,m-1} and E_{m-1}
            mbar_arrive_expect_tx(bar(2), 2 * S::kTile * 2);
            tma_load_2d(smem_addr(tile(kt ^ 1)), &tm_slot, 0, slot_row0 + (m - 1 - gc - 1) * C, bar(2));
            tma_load_2d(smem_addr(tile(6)), &tm_step, 0, ((m - 1) * p.H + h) * D, bar(2));
          }
        }
        if (j == 0) load_a_swz(ka, tile(kt), row0);
        float gdelta = 0.f;  // G_i - G_j = (goff_m - goff_c) + gl_i - gl_j, the large offsets subtracted in f64
        if constexpr (kGate) gdelta = static_cast<float>(p.ws.goff[qrow] - p.ws.goff[(int64_t)gc * p.HQ + hq]);
        wait_bar(st);
        const T* sQ = tile(2 + 2 * st);
        const T* sdO = tile(3 + 2 * st);

        float s[NC8][4], dp[NC8][4];
        wgmma_fence_operand(s);
        wgmma_fence_operand(dp);
        wgmma_fence();
        wgmma_k64<0>(s, ka, sQ, false);    // S^T = K~ Q^^T: [key][query]
        wgmma_k64<0>(dp, va, sdO, false);  // (dO V^T)^T = V dO^T
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(s);
        wgmma_fence_operand(dp);

        float colsum[2];  // this thread's key rows: sum over queries of dl
        softmax_backward<kGate>(s, dp, p.scale_log2, sLse2(st), sDelta(st), sGq(st), sGk(st), gdelta, r0, colsum);
        // dV_c += P^T dO_m (Eq. 5), E += ds^T Q^_m (Eq. 21): asynchronous while ds^T goes to shared memory.
        uint32_t pa[KC][4], da[KC][4];
        to_a_frags<T, NC8>(s, pa, 1.f);
        to_a_frags<T, NC8>(dp, da, p.scale);
        wgmma_fence_operand(dv_acc);
        wgmma_fence_operand(e_acc);
        wgmma_fence();
        wgmma_k64<1>(dv_acc, pa, sdO, true);
        wgmma_k64<1>(e_acc, da, sQ, true);
        wgmma_commit();
        store_acc<T, NC8>(dp, sDS, LDP, row0, p.scale);
        if constexpr (kGate) gate_tile_sums(colsum, dp, sDG + j * C, sRow, r0);
        __syncthreads();  // ds^T (and the row sums) complete in shared memory
        // dQ^_m += ds K~_{c,m} (Eq. 21): query rows now, A = ds = (ds^T)^T through ldmatrix.trans.
        uint32_t qa[KC][4];
        load_a_t<KC>(qa, sDS, LDP, row0);
        float dq[8][4];
        wgmma_fence_operand(dq);
        wgmma_fence();
        if (!(p.timing_skip & 8)) wgmma_k64<1>(dq, qa, tile(kt), false);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(dq);
        wgmma_fence_operand(dv_acc);
        wgmma_fence_operand(e_acc);
        wgmma_fence_frags(pa);  // the dV and E products read pa, da until the wait: keep their registers
        wgmma_fence_frags(da);
        if constexpr (kBulk) stage_acc(dq, sStage, row0);
        if constexpr (kDet) wait_turn(p.count_q + qrow, m - 1 - gc);
        if constexpr (kGate) add_gate_rows(p.dgrow + qrow * C, sRow, cm.len);
        if (!(p.timing_skip & 9)) {
          if constexpr (kBulk)
            bulk_add_rows<kDet>(sStage, p.dqacc + qrow * C * D, cm.len);
          else
            atomic_add_acc<8>(dq, p.dqacc + qrow * C * D, D, row0, cm.len);
        }
        if constexpr (kDet) pass_turn(p.count_q + qrow);
      }

      if (m > gc + 1) {
        // Back through K~_{c,m} = K~_{c,m-1} P_{m-1}^T (Eq. 33): dP_{m-1} += E^T K~_{c,m-1}, E <- E P_{m-1}.
        const int jc = m - 1;
        store_acc<T, NT>(e_acc, sEs, LDP, row0);
        wait_bar(2);
        __syncthreads();  // E complete in shared memory
        uint32_t ea[KC][4];
        load_a_t<KC>(ea, sEs, LDP, row0);  // A(d, key) = E[key][d]: rows d = 16 warp..
        float dpj[8][4];
        wgmma_fence_operand(dpj);
        wgmma_fence();
        wgmma_k64<1>(dpj, ea, tile(kt ^ 1), false);
        wgmma_commit();
        uint32_t eb[KD][4];
        to_a_frags<T, NT>(e_acc, eb, 1.f);
        wgmma_fence_operand(e_acc);
        wgmma_fence();  // eb was just written by ordinary instructions
        wgmma_k64<0>(e_acc, eb, tile(6), true);  // E <- E + E E_j^T
        wgmma_commit();
        wgmma_wait<1>();  // dP_j's product is done; E's may still run
        wgmma_fence_operand(dpj);
        wgmma_fence_frags(ea);
        int* count = p.count_p + (int64_t)jc * p.H + h;
        if constexpr (kBulk) stage_acc(dpj, sStage, row0);
        if constexpr (kDet) wait_turn(count, jc - 1 - gc);
        if (!(p.timing_skip & 2)) {
          if constexpr (kBulk)
            bulk_add_rows<kDet>(sStage, p.dpacc + ((int64_t)jc * p.H + h) * D * D, D);
          else
            atomic_add_acc<8>(dpj, p.dpacc + ((int64_t)jc * p.H + h) * D * D, D, row0, D);
        }
        if constexpr (kDet) pass_turn(count);
        wgmma_wait<0>();
        wgmma_fence_operand(e_acc);
        wgmma_fence_frags(eb);
        kt ^= 1;  // K~_{c,m-1} is the next step's K~_{c,m}
      }
    }

    // ---- The task's own gradients (rows of chunk c; all zero when c is its sequence's last chunk).
    store_task_gradients<kGate>(e_acc, dv_acc, p, fac, gc, h, row0, sDG);
  }
  // The last bulk additions: done before the CTA (and its shared memory) goes.
  if constexpr (kBulk)
    if (threadIdx.x < C) bulk_wait();
}

}  // namespace pathattn::cuda
