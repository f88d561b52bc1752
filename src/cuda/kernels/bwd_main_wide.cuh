// The main backward kernel at D = 128 on wgmma (PATHATTN_BWD_MAIN=mma runs bwd_main.cuh's mma.sync kernel instead):
// the math and the per-chunk steps of bwd_main.cuh (docs/math.md Eq. 18-23, 33), one task = (key chunk c, kv head
// h), one CTA = two warpgroups that split every product's columns, so that no value is computed twice:
//
//   warpgroup w owns the D-columns 64 w.. of the task's accumulators (dV, E = dK^), of each dQ^_m tile and of the
//   carried key K~ (phase 1), and the rows 64 w.. of each D x D tile dP_j; of the 64 x 64 logit tile S^T and of dP^T
//   it computes the query columns 32 w.. (k = D, m64n32), and shares P^T and dS^T through shared memory, from
//   which both warpgroups read them whole as the A operand of dV += P^T dO and E += dS^T Q^ (k = the 64 queries).
//
// Why not the D = 64 kernel's form (bwd_main_pair.cuh: a warpgroup per key chunk, A operands from registers): at
// D = 128 a warpgroup owning a whole chunk holds dV and E (64 x 128 f32: 128 registers per thread) beside S^T and
// dP^T (64) and the A fragments of K~ and V (64), past the 255-register limit, and the pair's tiles exceed shared
// memory. Here every operand that a warpgroup did not compute in its own registers comes from shared memory (wgmma's
// SS form, wgmma.cuh), the accumulators per thread are 32 + 32 (dV, E) plus 16 + 16 (S^T, dP^T), 32 (the dQ^ tail)
// or 64 (the dP_j tail), and the work per CTA and step is the same products as one chunk of the mma.sync kernel,
// which at D = 128 runs one warpgroup of mma.sync per SM (docs/perf/notes.md: its bwd_main is 2x D = 64's at the
// same FLOPs).
//
//   phase 1, m = c+1 .. last: K~_{c,m} (f32 registers, column half) to the CTA's slot and, rounded, to shared
//     memory; K~ <- K~ + K~ E_m (A = the whole K~ from shared memory, B = E_m's column half)
//   phase 2, m = last .. c+1, every query head of the group in turn:
//     S^T, dP^T (query half), softmax backward, P^T and dS^T to shared memory; one CTA barrier; then
//     dV += P^T dO^, E += dS^T Q^ (column half), dQ^_m = dS K~_{c,m} (column half), one atomic tile (f32)
//   chain (m > c + 1): E to shared memory, one barrier; dP_{m-1} += E^T K~_{c,m-1} (row half), E <- E + E E_{m-1}^T
//
// Loads: Q^, dO^ (bwd_prep's padded chunk tiles), lse2, delta and the gate rows of the next step go by TMA into the
// other of two stages, issued after the step's barrier (both warpgroups are then done with that stage); the
// chain's K~_{c,m-1} (the slot) and E_{m-1} at the first step of m. The deterministic mode's turns are taken per
// warp (bwd_main_pair.cuh warp_wait_turn), 8 warps per task: task c adds to dQ^_m after the m - 1 - c tasks above it
// and to dP_j after j - 1 - c, in the task list's order (plan.cu: a (sequence, head)'s chunks from the last).
//
// Two-level (p.carry_block = B > 0; docs/math.md Eq. 54-57, cuda/bwd_blocks.h, as in bwd_main.cuh and
// bwd_main_pair.cuh): the loops run over c's levels, the chunks of c's own block, then one level per later block mu,
// whose query chunks each meet K~_{c,s_mu} with Q'_m (tm_qfar) and add dQ'_m to p.dqfar; the level's step is F_mu
// (tm_bstep), its gradient dPi_mu (p.dpiacc, turns p.count_pi). The instance without blocks (kBlocks false) compiles
// to the per-chunk loops.
#pragma once

#include "cuda/kernels/bwd_main_pair.cuh"

namespace pathattn::cuda {

// Shared memory: 24 blocks of 64 x 64 16-bit elements (8 KB, 128-byte swizzle, 1024-byte aligned), a D-wide operand
// being two blocks (its column halves) and a D x D one four ([row half][column half]):
//   0-3: K~ buffers x = 0, 1 (blocks 2x, 2x + 1; phase 1: the carried copy in turn; phase 2: K~_{c,m}, K~_{c,m-1})
//   4-11: stage s = 0, 1: Q^ (4 + 4s, +1), dO^ (+2, +3); in phase 1 each stage holds an E_m instead
//   12-15: E_{m-1} of the chain step     16, 17: V_c     18, 19: P^T by step parity     20, 21: dS^T by step parity
//   22, 23: the task's E rounded (chain step)
// then floats: per stage lse2, delta, query gate, key gate [C] each; the gate's row sums [2 stages][4 warps][C];
// their sum over the warps [C] (the bulk turns' reduction source, 16-byte aligned); the gate's column sums
// [2 warpgroups][group][C]; then 5 mbarriers.
// The bulk turns (kBulk) stage their f32 tiles in blocks idle at the time: a step's dQ^ tail (warpgroup w's 64 x 64
// half, two 64 x 32 boxes of 8 KB) in the blocks of its stage that only warpgroup w read after the step's barrier,
// Q^'s half w and dO^'s half w; the chain step's dP_j (warpgroup w's 64 x 128 rows, four boxes) in two rounds of two
// boxes, warpgroup 0 in the P^T blocks, warpgroup 1 in the dS^T blocks (both parities; read by no product between
// the chain's barrier and the next step's stores).
struct BwdWideSmem {
  static constexpr int C = kChunk, kTile = C * 64;
  static constexpr int kK = 0, kStage = 4, kStep = 12, kV = 16, kP = 18, kDS = 20, kE = 22, kBlocks = 24;
  static constexpr int kFloats = 2 * 4 * C + 2 * 4 * C + C;
  static constexpr int bytes(int group, bool gate) {
    return 1024 + kBlocks * kTile * 2 + (kFloats + (gate ? 2 * group * C : 0)) * 4 + 5 * 8;
  }
};

// kBulk (deterministic calls, the default; PATHATTN_BWD_TURNS=atomic turns it off): the turns' tiles as bulk
// reductions, as bwd_main_pair.cuh's kBulk (docs/perf/notes.md "The turns' tiles as bulk reductions"): each warpgroup
// stages its tile (BwdWideSmem says where), its first warp alone waits for the turn, and that warp's lane 0 issues the
// copy engine's adds (tmaps: the f32 accumulators as [rows, D] maps of 64 x 32 boxes) and holds the pass; two passes
// per task and turn instead of eight.
template <typename T, bool kGate, bool kDet, bool kBlocks, bool kBulk = false>
__global__ void __launch_bounds__(256, 1)
    bwd_main_wide_kernel(const BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_step,
                         const __grid_constant__ CUtensorMap tm_slot, const __grid_constant__ CUtensorMap tm_qfar,
                         const __grid_constant__ CUtensorMap tm_bstep, const __grid_constant__ BwdTurnMaps tmaps) {
  using namespace fwd_detail;
  using namespace bwd_detail;
  using S = BwdWideSmem;
  static_assert(kDet || !kBulk, "the bulk form is the deterministic turns'");
  using Tag = typename WgmmaTag<T>::type;
  constexpr int D = 128, C = kChunk;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  T* sm = reinterpret_cast<T*>(smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u));
  auto blk = [&](int i) { return sm + i * S::kTile; };
  auto desc = [&](int i) { return wgmma_desc_sw128(smem_addr(blk(i))); };
  float* fl = reinterpret_cast<float*>(sm + S::kBlocks * S::kTile);
  auto sLse2 = [&](int s) { return fl + s * 4 * C; };
  auto sDelta = [&](int s) { return fl + s * 4 * C + C; };
  auto sGq = [&](int s) { return fl + s * 4 * C + 2 * C; };
  auto sGk = [&](int s) { return fl + s * 4 * C + 3 * C; };
  auto sRow = [&](int s) { return fl + 8 * C + s * 4 * C; };  // [4 warps][C] row sums of dl (kGate)
  float* sRowSum = fl + 16 * C;                                // [C] their sum (kGate, kBulk)
  float* sDG0 = fl + 17 * C;                                   // [2][group][C] column sums (kGate)
  auto sDG = [&](int w) { return sDG0 + w * p.group * C; };
  MbarSet bar(smem_addr(sDG0 + (kGate ? 2 * p.group * C : 0)));
  // mbarriers: 0, 1 query stages; 2 the chain's K~_{c,m-1} and E_{m-1} (K~_{c,last} at phase 2's start); 3, 4
  // phase 1's E_m by stage
  __shared__ int s_task;
  __shared__ int* s_pending[8][kMaxHeld];  // (kDet) per warp: the turns' deferred passes (bwd_main_pair.cuh defer_pass)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // warp-uniform (no wgmma serialised by ptxas: bwd_main_pair.cuh, C7520)
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int row0 = (warp % 4) * 16, r0 = row0 + lane / 4;  // this warp's 16 rows of every 64-row product
  const bool lead = __shfl_sync(0xffffffffu, warp % 4, 0) == 0;  // (kBulk) the warpgroup's first warp, which adds
  T* slot = static_cast<T*>(p.slots) + (int64_t)blockIdx.x * p.slot_chunks * C * D;
  const int slot_row0 = blockIdx.x * p.slot_chunks * C;
  const T* khat = static_cast<const T*>(p.ws.khat);
  const T* vin = static_cast<const T*>(p.v);

  bar.init(5);
  HeldPasses held{s_pending[warp], 0};  // (bwd_main_pair.cuh)
  const TurnFence fence = turn_fence_of(p);  // (bwd_tiles.cuh)
  // Issued by thread 0 only. A level's step (D x D: E_unit at a near level, F of the block starting at unit at a far
  // one) into the four blocks from b0 ([row half][column half]), on barrier i.
  auto load_step = [&](int i, int b0, bool far, int unit, int h) {
    const CUtensorMap* map = far ? &tm_bstep : &tm_step;
    const int erow = ((far ? p.blk_of[unit] : unit) * p.H + h) * D;
#pragma unroll
    for (int rb = 0; rb < 2; ++rb)
#pragma unroll
      for (int cb = 0; cb < 2; ++cb) tma_load_2d(smem_addr(blk(b0 + 2 * rb + cb)), map, 64 * cb, erow + 64 * rb, bar(i));
  };
  auto issue_step = [&](int i, int b0, bool far, int unit, int h) {
    mbar_arrive_expect_tx(bar(i), 4 * S::kTile * 2);
    load_step(i, b0, far, unit, h);
  };
  // stage s <- step (query chunk m, head hq): Q^_m (Q'_m at a far level), dO^_m
  auto issue_query = [&](int s, int m, int hq, int gc, bool far) {
    const int64_t qrow = (int64_t)m * p.HQ + hq;
    mbar_arrive_expect_tx(bar(s), 4 * S::kTile * 2 + 2 * C * 4 + (kGate ? 2 * C * 4 : 0));
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      tma_load_2d(smem_addr(blk(S::kStage + 4 * s + x)), far ? &tm_qfar : &tm_q, 64 * x, static_cast<int>(qrow * C), bar(s));
      tma_load_2d(smem_addr(blk(S::kStage + 4 * s + 2 + x)), &tm_do, 64 * x, static_cast<int>(qrow * C), bar(s));
    }
    bulk_load(smem_addr(sLse2(s)), p.lse2 + qrow * C, C * 4, bar(s));
    bulk_load(smem_addr(sDelta(s)), p.delta + qrow * C, C * 4, bar(s));
    if constexpr (kGate) {
      bulk_load(smem_addr(sGq(s)), p.ws.gl + qrow * C, C * 4, bar(s));
      bulk_load(smem_addr(sGk(s)), p.ws.gl + ((int64_t)gc * p.HQ + hq) * C, C * 4, bar(s));
    }
  };
  // Level i's K~ (the slot's entry i) into K~ buffer x, with the level's step into the chain's blocks when `step`,
  // on barrier 2.
  auto issue_ktile = [&](int x, int i, bool far, int unit, int h, bool step) {
    mbar_arrive_expect_tx(bar(2), (step ? 6 : 2) * S::kTile * 2);
#pragma unroll
    for (int cb = 0; cb < 2; ++cb)
      tma_load_2d(smem_addr(blk(S::kK + 2 * x + cb)), &tm_slot, 64 * cb, slot_row0 + i * C, bar(2));
    if (step) load_step(2, S::kStep, far, unit, h);
  };
  __syncthreads();

  for (;;) {
    const int task = take_task(p, s_task);
    if (task < 0) break;
    const int gc = task / p.H, h = task % p.H;
    const ChunkInfo ci = p.chunks[gc];
    const int last = ci.last;
    const int64_t fac = (int64_t)gc * p.H + h;
    const BwdLevelsOf<kBlocks> lv(BwdLevels::of(gc, ci.first, last, kBlocks ? p.carry_block : 0));
    const int levels = lv.count();

    // V_c into its two blocks (rows past the chunk's end zero), the first E step, K^_c's column half in f32.
    load_tile<T, D, true>(blk(S::kV), 64, vin + ci.b * p.sv.b + (int64_t)ci.t0 * p.sv.t + h * p.sv.h, p.sv.t, ci.len);
    cp_async_commit();
    if (threadIdx.x == 0 && levels > 1) {
      fence_proxy_async_smem();  // the previous task's reads of stage 0, before the copy engine's writes
      issue_step(3, S::kStage, lv.is_far(0), lv.unit(0), h);
    }
    if constexpr (kGate)
      for (int i = threadIdx.x; i < 2 * p.group * C; i += blockDim.x) sDG0[i] = 0.f;
    float kc[8][4];
    load_acc<T, 8>(kc, khat + fac * C * D + 64 * wg, D, row0);
    cp_async_wait<0>();
    fence_proxy_async_smem();  // V, written by cp.async, is read by wgmma (the async proxy)

    // ---- Phase 1: carry K^_c to every level's start, keeping each copy in the slot (Eq. 18, 32, 49).
    for (int i = 0; i < levels; ++i) {
      store_acc<T, 8>(kc, slot + (int64_t)i * C * D + 64 * wg, D, row0);
      if (i + 1 == levels) break;
      const int b = i & 1;
      store_acc_swz<T, 8>(kc, blk(S::kK + 2 * b + wg), row0, 0);
      fence_proxy_async_smem();
      __syncthreads();  // K~ buffer b whole; both warpgroups done with step i - 1 (its E stage and K~ buffer)
      if (threadIdx.x == 0 && i + 2 < levels) {
        fence_proxy_async_smem();
        issue_step(3 + (b ^ 1), S::kStage + 4 * (b ^ 1), lv.is_far(i + 1), lv.unit(i + 1), h);
      }
      bar.wait(3 + b);
      // K~[:, half] += K~ step_i[:, half]: A = K~ (K-major, k = d over both halves), B(k, n) = step_i[k][n]
      // (MN-major; E_m, or F_mu at a far level)
      wgmma_fence_operand(kc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        wgmma_m64n64k16_ss<0, 1>(kc, desc(S::kK + 2 * b + kk / 4) + 2 * (kk % 4),
                                 desc(S::kStage + 4 * b + 2 * (kk / 4) + wg) + 128 * (kk % 4), 1, Tag{});
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(kc);
    }
    // The slot's rows were written by ordinary stores; the copy engine reads them next (phase 2).
    fence_proxy_async_global();
    __syncthreads();

    // ---- Phase 2: levels from the farthest back to the nearest, each level's query chunks from its last, every
    // query head of the group in turn (with blocks off: query chunks from the last back to c + 1). One iteration per
    // query chunk m of level i, the chain step after a level's last (one loop, as the per-chunk form's over m was).
    float e_acc[8][4], dv_acc[8][4];
    zero(e_acc);
    zero(dv_acc);
    int kt = 0;  // K~ buffer holding the current level's K~
    if (threadIdx.x == 0 && levels > 0) {  // (a sequence's last chunk has no later query chunk: no phase 2)
      fence_proxy_async_smem();
      issue_ktile(0, levels - 1, false, 0, h, false);
      issue_query(0, lv.query_hi(levels - 1), h * p.group, gc, lv.is_far(levels - 1));
    }
    int it = 0;  // (query chunk, head) steps so far: the stage and the P^T / dS^T buffer are it & 1
    for (int i = levels - 1, m = levels > 0 ? lv.query_hi(levels - 1) : 0; i >= 0;) {
      const bool far = lv.is_far(i);
      const int m_lo = lv.query_lo(i);
      const bool level_start = !kBlocks || m == lv.query_hi(i);  // the level's first query chunk
      const ChunkInfo cm = p.chunks[m];
      if (i == levels - 1 && level_start) {
        bar.wait(2);
        __syncthreads();  // every thread has seen this completion before barrier 2 is armed again
      }
      // The step's tail: its turn (kDet), the gate's row sums, dQ^_m's atomic tile, the pass. Of the last head of a
      // query chunk with a chain step after it, the tail runs after the chain's products are issued (below), so that
      // its reductions and its wait for the turn overlap them instead of delaying their start: the chain step needs
      // only E, and the tail only dq and the stage's row sums (stage st is next written two steps later). In the fast
      // mode only (v18, kTailInChain): measured on an H100 (twenty-ninth session, two A/B rounds against the tail in
      // the loop), bwd_main 0.8-1.5% faster in the fast mode at D = 128, T 4096 / 16384, but 1.6-2.0% slower in the
      // deterministic mode, whose turn the moved tail then waits for while the chain's products are in flight.
      constexpr bool kTailInChain = !kDet;
      float dq[8][4];
      // (dQ^_m at a near level, dQ'_m at a far one: one turn counter per query row, cuda/bwd_blocks.h)
      auto dq_tail = [&](int64_t qrow, int st, int len) {
        if constexpr (kBulk) {
          // Staged in Q^'s and dO^'s column half wg of stage st (only this warpgroup's products, done, read them
          // after the step's barrier; the stage is loaded again after the next step's barrier, which the lead lane
          // reaches only once these reductions have read it).
          float* box0 = reinterpret_cast<float*>(blk(S::kStage + 4 * st + wg));
          constexpr int kBoxStride = 2 * S::kTile / 2;  // two blocks on: dO^'s half wg (floats)
          stage_acc_swz(dq, box0, kBoxStride, row0, len);
          if constexpr (kGate)
            if (wg == 0 && threadIdx.x < C) {  // the 4 warps' row sums in add_gate_rows' order; rows >= len add 0
              const float* rs = sRow(st);
              const int t = threadIdx.x;
              sRowSum[t] = t < len ? (rs[t] + rs[C + t]) + (rs[2 * C + t] + rs[3 * C + t]) : 0.f;
            }
          fence_proxy_async_smem();         // these stores, before the copy engine reads them
          named_barrier_sync(1 + wg, 128);  // the warpgroup's tile staged
          if (lead) {
            if (!(p.timing_skip & 1024)) warp_wait_turn(p.count_q + qrow, lv.query_turn(m), 2);
            if (lane == 0) {
              fence_proxy_async_global();  // the turn's acquire, before the copy engine's adds
              reduce_staged_tile(far ? &tmaps.dqfar : &tmaps.dq, 64 * wg, static_cast<int>(qrow * C), box0, kBoxStride);
              if constexpr (kGate)
                if (wg == 0) bulk_reduce_add_f32(p.dgrow + qrow * C, smem_addr(sRowSum), C * 4);
              bulk_commit_group();
            }
            defer_pass<true>(held, p.count_q + qrow, fence, p.held_passes);
          }
          return;
        }
        if constexpr (kDet) if (!(p.timing_skip & 1024)) warp_wait_turn(p.count_q + qrow, lv.query_turn(m), 8);
        if constexpr (kGate)
          if (wg == 0) add_gate_rows(p.dgrow + qrow * C, sRow(st), len);  // threads < len: warps 0, 1
        atomic_add_acc<8>(dq, (far ? p.dqfar : p.dqacc) + qrow * C * D + 64 * wg, D, row0, len);
        if constexpr (kDet) defer_pass(held, p.count_q + qrow, fence, p.held_passes);
      };
      const bool chain = i > 0;         // a chain step follows the level
      const bool level_end = m == m_lo;  // (its last query chunk)
      for (int j = 0; j < p.group; ++j, ++it) {
        const int st = it & 1;
        const int hq = h * p.group + j;
        const int64_t qrow = (int64_t)m * p.HQ + hq;
        const int bq = S::kStage + 4 * st, bdo = bq + 2;
        float gdelta = 0.f;  // G_i - G_j = (goff_m - goff_c) + gl_i - gl_j, the large offsets subtracted in f64
        if constexpr (kGate) gdelta = static_cast<float>(p.ws.goff[qrow] - p.ws.goff[(int64_t)gc * p.HQ + hq]);
        bar.wait(st);
        // S^T = K~ Q^^T and dP^T = V dO^T for this warpgroup's 32 queries (B rows 32 wg..: +4096 bytes), k = D.
        float s[4][4], dp[4][4];
        wgmma_fence_operand(s);
        wgmma_fence_operand(dp);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          wgmma_m64n32k16_ss<0, 0>(s, desc(S::kK + 2 * kt + kk / 4) + 2 * (kk % 4), desc(bq + kk / 4) + 256 * wg + 2 * (kk % 4),
                                   kk > 0, Tag{});
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          wgmma_m64n32k16_ss<0, 0>(dp, desc(S::kV + kk / 4) + 2 * (kk % 4), desc(bdo + kk / 4) + 256 * wg + 2 * (kk % 4),
                                   kk > 0, Tag{});
        wgmma_commit();
        if constexpr (kDet) flush_passes<kBulk>(held, fence, p.held_passes - 1);  // the last steps' passes, while these run
        wgmma_wait<0>();
        wgmma_fence_operand(s);
        wgmma_fence_operand(dp);
        float colsum[2];  // this thread's key rows: sum over this warpgroup's queries of dl
        softmax_backward<kGate>(s, dp, p.scale_log2, sLse2(st) + 32 * wg, sDelta(st) + 32 * wg, sGq(st) + 32 * wg,
                                sGk(st), gdelta, r0, colsum);
        store_acc_swz<T, 4>(s, blk(S::kP + st), row0, 32 * wg);
        store_acc_swz<T, 4>(dp, blk(S::kDS + st), row0, 32 * wg, p.scale);
        if constexpr (kGate) gate_tile_sums(colsum, dp, sDG(wg) + j * C, sRow(st) + 32 * wg, r0, warp % 4);
        fence_proxy_async_smem();
        // (kBulk) The previous step's dQ^ tile, staged in stage st ^ 1, which thread 0 loads again after the barrier:
        // read by its reductions first.
        if constexpr (kBulk)
          if (lead && lane == 0) bulk_wait_group_read<0>();
        __syncthreads();  // P^T and dS^T whole; both warpgroups done with the previous step (stage st ^ 1)
        if (threadIdx.x == 0) {
          fence_proxy_async_smem();
          if (j + 1 < p.group)
            issue_query(st ^ 1, m, hq + 1, gc, far);
          else if (m > m_lo)
            issue_query(st ^ 1, m - 1, h * p.group, gc, far);
          else if (i > 0)
            issue_query(st ^ 1, lv.query_hi(i - 1), h * p.group, gc, lv.is_far(i - 1));
          // the chain's K~ and step (level i - 1's): their blocks were last read by the previous level's steps and
          // chain step
          if (j == 0 && level_start && i > 0) issue_ktile(kt ^ 1, i - 1, lv.is_far(i - 1), lv.unit(i - 1), h, true);
        }
        // dV += P^T dO^ (Eq. 5), E += dS^T Q^ (Eq. 21): A K-major (k = the queries), B MN-major, column half;
        // dQ^_m = dS K~_{c,m} (Eq. 21): A(query, key) = dS^T[key][query] (MN-major), B = K~'s column half.
        wgmma_fence_operand(dv_acc);
        wgmma_fence_operand(e_acc);
        wgmma_fence_operand(dq);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n64k16_ss<0, 1>(dv_acc, desc(S::kP + st) + 2 * kk, desc(bdo + wg) + 128 * kk, 1, Tag{});
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n64k16_ss<0, 1>(e_acc, desc(S::kDS + st) + 2 * kk, desc(bq + wg) + 128 * kk, 1, Tag{});
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n64k16_ss<1, 1>(dq, desc(S::kDS + st) + 128 * kk, desc(S::kK + 2 * kt + wg) + 128 * kk, kk > 0, Tag{});
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(dv_acc);
        wgmma_fence_operand(e_acc);
        wgmma_fence_operand(dq);
        if (!kTailInChain || !chain || !level_end || j + 1 < p.group) dq_tail(qrow, st, cm.len);
      }

      if (!level_end) {  // the level's next query chunk
        --m;
        continue;
      }
      if (chain) {
        // Back through level i's start = level i - 1's K~ carried by its step (Eq. 33, 50): dstep_{i-1} += E^T
        // K~_{i-1} (dP_m at a near level, dPi_mu at a far one), E <- E + E step_{i-1}^T.
        const bool far_prev = lv.is_far(i - 1);
        const int u = lv.unit(i - 1);
        store_acc_swz<T, 8>(e_acc, blk(S::kE + wg), row0, 0);
        fence_proxy_async_smem();
        bar.wait(2);      // K~_{c,m-1}, E_{m-1}
        __syncthreads();  // both halves of E in shared memory
        // dP_{m-1}, rows d = 64 wg..: A(d, key) = E[key][d] (MN-major, E's half wg), B(key, d') = K~_{c,m-1}
        // (MN-major, both halves into the accumulator's two 64-column halves)
        float dpj[16][4];
        wgmma_fence_operand(dpj);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          wgmma_m64n64k16_ss<1, 1, 0>(dpj, desc(S::kE + wg) + 128 * kk, desc(S::kK + 2 * (kt ^ 1)) + 128 * kk, kk > 0, Tag{});
          wgmma_m64n64k16_ss<1, 1, 8>(dpj, desc(S::kE + wg) + 128 * kk, desc(S::kK + 2 * (kt ^ 1) + 1) + 128 * kk, kk > 0,
                                      Tag{});
        }
        wgmma_commit();
        // E[:, half] += E E_{m-1}^T[:, half]: A = E (K-major, k = d over both halves), B(k = d, n = d'') =
        // E_{m-1}[d''][d] (K-major: E_{m-1}'s row half wg)
        wgmma_fence_operand(e_acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          wgmma_m64n64k16_ss<0, 0>(e_acc, desc(S::kE + kk / 4) + 2 * (kk % 4), desc(S::kStep + 2 * wg + kk / 4) + 2 * (kk % 4),
                                   1, Tag{});
        wgmma_commit();
        // The last head's dQ^_m tail, while both products run (its turn comes before dP_j's, as before the move).
        if constexpr (kTailInChain) dq_tail((int64_t)m * p.HQ + h * p.group + p.group - 1, (it - 1) & 1, cm.len);
        wgmma_wait<1>();  // dP_j's products are done; E's may still run
        wgmma_fence_operand(dpj);
        const int64_t unit_h = (int64_t)(far_prev ? p.blk_of[u] : u) * p.H + h;
        int* count = (far_prev ? p.count_pi : p.count_p) + unit_h;
        if constexpr (kBulk) {
          // This warpgroup's 64 rows in two rounds of 64 columns, staged in the P^T (warpgroup 0) or dS^T
          // (warpgroup 1) blocks of both parities, idle since the chain's barrier; one turn, one pass.
          float* sbuf = reinterpret_cast<float*>(blk(wg == 0 ? S::kP : S::kDS));
          constexpr int kBoxStride = S::kTile / 2;  // the next block (floats)
          const CUtensorMap* map = far_prev ? &tmaps.dpi : &tmaps.dp;
          const int y = static_cast<int>(unit_h * D) + 64 * wg;
          stage_acc_swz<0>(dpj, sbuf, kBoxStride, row0, 64);
          fence_proxy_async_smem();
          named_barrier_sync(1 + wg, 128);  // columns 0-63 staged
          if (lead) {
            if (!(p.timing_skip & 1024)) warp_wait_turn(count, lv.step_turn(i - 1), 2);
            if (lane == 0) {
              fence_proxy_async_global();
              reduce_staged_tile(map, 0, y, sbuf, kBoxStride);
              bulk_commit_group();
              bulk_wait_group_read<0>();
            }
          }
          named_barrier_sync(1 + wg, 128);  // ... and read: the buffer takes columns 64-127
          stage_acc_swz<8>(dpj, sbuf, kBoxStride, row0, 64);
          fence_proxy_async_smem();
          named_barrier_sync(1 + wg, 128);
          if (lead) {
            if (lane == 0) {
              reduce_staged_tile(map, 64, y, sbuf, kBoxStride);
              bulk_commit_group();
            }
            defer_pass<true>(held, count, fence, p.held_passes);
          }
        } else {
          if constexpr (kDet) if (!(p.timing_skip & 1024)) warp_wait_turn(count, lv.step_turn(i - 1), 8);
          atomic_add_acc<16>(dpj, (far_prev ? p.dpiacc : p.dpacc) + unit_h * D * D + (int64_t)64 * wg * D, D, row0, 64);
          if constexpr (kDet) defer_pass(held, count, fence, p.held_passes);
        }
        wgmma_wait<0>();
        wgmma_fence_operand(e_acc);
        // (kBulk) The next step stores P^T and dS^T into the staging blocks: the round's reductions read them first.
        if constexpr (kBulk) {
          if (lead && lane == 0) bulk_wait_group_read<0>();
          __syncthreads();
        }
        kt ^= 1;  // level i - 1's K~ is the next level's
      }
      if (--i >= 0) m = lv.query_hi(i);
    }

    if constexpr (kDet) flush_passes<kBulk>(held, fence);
    // (kBulk) The next task's loads overwrite the staging blocks (a flush without the fence, timing only, waits for
    // nothing).
    if constexpr (kBulk)
      if (lead && lane == 0) bulk_wait_group_read<0>();
    // ---- The task's own gradients (zero when no query chunk follows c): dK^_c = E, dV_c, column halves.
    if constexpr (kGate) __syncthreads();  // the column sums were written by other threads
    store_acc_f32<8>(e_acc, p.dkacc + fac * C * D + 64 * wg, D, row0);
    store_acc_f32<8>(dv_acc, p.dvacc + fac * C * D + 64 * wg, D, row0);
    if constexpr (kGate)
      for (int i = threadIdx.x; i < p.group * C; i += blockDim.x)  // the two warpgroups' query halves, in order
        p.dgacc[((int64_t)gc * p.HQ + h * p.group + i / C) * C + i % C] = sDG(0)[i] + sDG(1)[i];
  }
  // (kBulk) A flush without the fence (timing only) left reductions pending: they read shared memory until done.
  if constexpr (kBulk)
    if (lead && lane == 0) bulk_wait_group<0>();
}

}  // namespace pathattn::cuda
