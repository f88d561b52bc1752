// The main forward kernel on Hopper's warpgroup tensor cores (wgmma, sm_90a): D = 64 and D = 128
// (both the default: launch/fwd.cu). Same math and schedule as
// fwd.cuh (docs/math.md Eq. 12, 13, 15, 32): one CTA = one warpgroup of 4 warps per (query chunk m, query head),
// warp w owning query rows 16w..16w+15, the running query Q~ in f32 registers.
//
//   diagonal (warp-level mma.sync, fwd_tiles.cuh):  S = lower(Q K^T) - lower(Q W^T) M,  Q~ = Q - lower(Q W^T) U
//   c = m-1 .. first (wgmma, A = Q~ or P from registers, B from shared memory):
//        S = Q~ K^_c^T                      m64n64k16 x 4, K-major B        (Eq. 15)
//        Q~ <- Q~ + Q~ E_c^T               m64n64k16 x 4 into Q~'s registers (Eq. 32)
//        online softmax; O += P V_c         m64n64k16 x 4, V read transposed
//
// Why: the mma.sync kernel reads every B tile from shared memory once per warp (4x per CTA) through ldmatrix and
// was bound by that traffic and its issue slots (docs/perf/notes.md); a wgmma reads B once per 64-row warpgroup.
// Key chunks stream through two shared-memory stages, loaded by the bulk copy engine (TMA: one thread issues three
// 8 KB tile copies and the gate row; the tiles land 128-byte swizzled) and completed on one mbarrier per stage;
// the first version issued 12 cp.async per thread per chunk with their address arithmetic (ncu: the integer pipe
// was the busiest, 2.5 IPC for ~950 instructions per warp and chunk pair).
//
// D = 128: every D-wide operand is KH = 2 sub-tiles of 64 columns (a wgmma B operand's rows must be 128 bytes apart
// in the swizzle), E = [D][D] four; a product over d takes its k16 steps from sub-tile kk / 4, an output of 128
// columns is two m64n64 accumulators (the halves of Q~ or O). The diagonal block reads the same sub-tiles through
// fwd_tiles.cuh's swz at ld = 64. 19 tiles (152 KB): one CTA per SM (PATHATTN_FWD128=twoe; kOneE below is the default).
//
// kOneE (D = 128 only; the default, launch/fwd.cu; PATHATTN_FWD128=twoe for the two slots): one E slot shared
// by the two stages instead of one per stage, so 13 tiles (106 KB) and two CTAs per SM: with one CTA of one
// warpgroup the tensor cores idle through every softmax and every wait, and a second CTA fills those gaps as the
// D = 64 kernel's co-resident CTAs do. The slot holds the diagonal's W and U first (the E slot is 4 tiles, W and U
// 2 each), then E_c; E_{c-1} is loaded (its own barrier) as soon as the warpgroup's Q~ update with E_c is done, so
// it streams in during c's softmax and P V and during c - 1's S; K^ and V keep their two stages.
#pragma once

#include "cuda/fwd_blocks.h"
#include "cuda/kernels/fwd_tiles.cuh"
#include "cuda/kernels/tma.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace pathattn::cuda {

// Shared memory: 64 x 64 tiles of 16-bit elements (8 KB), 128-byte swizzle (fwd_tiles.cuh swz at ld 64),
// each 1024-byte aligned for the wgmma descriptors. KH = D / 64 sub-tiles per D-wide operand.
//   stage s in {0, 1}, at tile s * kStage: K^ (K for the diagonal) KH tiles, then E KH x KH tiles ([n half][k half];
//   W for the diagonal in the first KH), then V KH tiles
//   tile 2 kStage: U (KH tiles), then M of the diagonal chunk; then the gate: query chunk [C], key chunk per stage
//   [2][C]; then one mbarrier per stage.
//   kOneE: a stage is K^ then V (KH tiles each); tile 2 kStage: the E slot (KH x KH tiles: W, U of the diagonal,
//   then E of the chunk in use), then M; the gate as above; one mbarrier per stage and one for the E slot.
template <int D, bool kOneE = false>
struct FwdWgSmem {
  static constexpr int KH = D / 64;
  static_assert(!kOneE || KH == 2, "the shared E slot holds the diagonal's W and U: D = 128 only");
  static constexpr int kTile = kChunk * 64;  // elements
  // Offsets inside a stage (kE: the stage's E; with kOneE the stages hold K^ and V only).
  static constexpr int kK = 0, kE = KH, kV = kOneE ? KH : KH + KH * KH, kStage = kOneE ? 2 * KH : 2 * KH + KH * KH;
  // kOneE: the shared E slot (KH x KH tiles) after the stages, the diagonal's W in its first KH tiles, U in the next.
  static constexpr int kESlot = 2 * kStage;
  static constexpr int kU = kOneE ? kESlot + KH : 2 * kStage;
  static constexpr int kM = kOneE ? kESlot + KH * KH : kU + KH, kTiles = kM + 1;
  static constexpr int kHalves = kTiles * kTile;
  static constexpr int kBars = kOneE ? 3 : 2;  // one per stage, [kOneE] then the E slot's
  static constexpr int kBytes = kHalves * 2 + 3 * kChunk * 4 + kBars * 8 + 1024;  // + 1024: room to align the base
};

// tm_k, tm_e: the workspace's K^ and E as [rows, D] (tensor_maps.h, 64 x 64 boxes); tm_v: the input v as
// [B, T, H, D] (64 x 64 boxes); tm_kf, tm_f: the two-level forward's K' and block steps F (p.carry_block > 0), as K^
// and E.
//
// Two-level (p.carry_block = B > 0; docs/math.md Eq. 51-53): the chunks of the query's own block are met as above;
// a chunk c of an earlier block is "far": its logits are Q~ K'_c^T, with Q~ carried to the end of c's block, and
// Q~ steps only after the block's first chunk, by F (Q~ <- Q~ + Q~ F^T = Q~ Pi). Nothing else changes: the stages,
// barriers and the E slot carry K' for K^ and F for E.
template <typename T, int D, bool kGate, bool kOneE = false>
__global__ void __launch_bounds__(128, D == 64 ? 3 : (kOneE ? 2 : 1))
    fwd_wgmma_kernel(const FwdParams p, const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_e,
                     const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_kf,
                     const __grid_constant__ CUtensorMap tm_f) {
  using namespace fwd_detail;
  using L = FwdWgSmem<D, kOneE>;
  constexpr int C = kChunk, KH = L::KH;
  constexpr int NT = D / 8, KD = D / 16, NC8 = C / 8, KC = C / 16;
  static_assert(D == 64 || D == 128, "the wgmma forward has D = 64 and 128 instances");
  constexpr float kLog2e = 1.4426950408889634f;
  using Tag = typename WgmmaTag<T>::type;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  T* sm = reinterpret_cast<T*>(smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u));
  auto tile = [&](int i) { return sm + i * L::kTile; };
  float* sGq = reinterpret_cast<float*>(sm + L::kHalves);           // [C]    gate of the query chunk
  float* sGk = sGq + C;                                             // [2][C] gate of the key chunk per stage
  const uint32_t bar0 = smem_addr(sGk + 2 * C);                     // [kBars] mbarriers, 8 bytes each
  auto bar = [&](int s) { return bar0 + 8 * s; };

  const CtaWork work = cta_work(p);
  const int h = work.h, hq = work.hq, gc = work.gc;
  const ChunkInfo ci = p.chunks[gc];
  const int first = ci.first;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane % 4;
  const int r0 = warp * 16 + lane / 4;  // this thread's two query rows in the chunk: r0, r0 + 8

  const T* vin = static_cast<const T*>(p.v);
  auto ws_tile = [&](const void* base, int chunk) {  // C x D workspace tile
    return static_cast<const T*>(base) + ((int64_t)chunk * p.H + h) * C * D;
  };
  // The two-level forward's schedule (cuda/fwd_blocks.h): far chunks, and where the query steps (all chunks near,
  // a step after each but the first, when it is off).
  const FwdBlockView bv = FwdBlockView::of(first, gc, p.carry_block);
  auto stage_tile = [&](int s, int i) { return tile(s * L::kStage + i); };
  constexpr int kEBar = 2;  // kOneE: the E slot's barrier
  // E tile i (= [n half y][k half x] at y * KH + x) of the chunk in stage s.
  auto e_tile = [&](int s, int i) { return kOneE ? tile(L::kESlot + i) : stage_tile(s, L::kE + i); };
  // The step after an earlier chunk (E, or F of a far block) into stage s's E tiles (kOneE: the E slot), completing
  // on barrier `b`; thread 0 only. Sub-tile (y, x) of a matrix: its rows 64 y.., columns 64 x...
  auto issue_e = [&](int s, int chunk, uint32_t b) {
    const bool far = bv.far(chunk);
    const int erow = ((far ? p.blk_of[chunk] : chunk) * p.H + h) * D;
#pragma unroll
    for (int y = 0; y < KH; ++y)
#pragma unroll
      for (int x = 0; x < KH; ++x)  // E tile [n half y][k half x]: E rows d = 64 y.., columns d' = 64 x..
        tma_load_2d(smem_addr(e_tile(s, y * KH + x)), far ? &tm_f : &tm_e, 64 * x, erow + 64 * y, b);
  };
  // K^ (K' if far), V (and the gate row) of an earlier (full) chunk into stage s, and its step with them unless
  // kOneE (none if Q~ does not step after it); thread 0 only.
  auto issue_chunk = [&](int s, int chunk) {
    const ChunkInfo cc = p.chunks[chunk];
    const bool with_e = !kOneE && bv.steps_after(chunk);
    const uint32_t bytes_tiles = (2 * KH + (with_e ? KH * KH : 0)) * L::kTile * 2;
    mbar_arrive_expect_tx(bar(s), bytes_tiles + (kGate ? C * 4 : 0));
    const int krow = (chunk * p.H + h) * C;
    const CUtensorMap* tmk = bv.far(chunk) ? &tm_kf : &tm_k;
#pragma unroll
    for (int x = 0; x < KH; ++x) tma_load_2d(smem_addr(stage_tile(s, L::kK + x)), tmk, 64 * x, krow, bar(s));
    if (with_e) issue_e(s, chunk, bar(s));
#pragma unroll
    for (int x = 0; x < KH; ++x) tma_load_4d(smem_addr(stage_tile(s, L::kV + x)), &tm_v, 64 * x, cc.t0, h, cc.b, bar(s));
    if constexpr (kGate) bulk_load(smem_addr(sGk + s * C), p.ws.gl + ((int64_t)chunk * p.HQ + hq) * C, C * 4, bar(s));
  };
  // kOneE: E of `chunk` into the E slot once every warp is done reading it (the caller's __syncthreads).
  auto issue_e_slot = [&](int chunk) {
    fence_proxy_async_smem();  // the slot's earlier reads, ordered before the copy engine's writes
    mbar_arrive_expect_tx(bar(kEBar), KH * KH * L::kTile * 2);
    issue_e(0, chunk, bar(kEBar));
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < L::kBars; ++b) mbar_init(bar(b), 1);
    mbar_fence_init();
  }
  __syncthreads();

  // Prologue: the diagonal chunk's raw K, W, V, U, M into stage 0's K, E and V slots and the U, M tiles (ld 64:
  // D-wide tiles as KH sub-tiles, fwd_tiles.cuh swz), then the next key chunk (stage 1).
  T* const dK = stage_tile(0, L::kK);
  T* const dW = e_tile(0, 0);  // kOneE: the E slot's first KH tiles, U in the next KH
  T* const dV = stage_tile(0, L::kV);
  load_tile<T, D, true>(dK, 64, static_cast<const T*>(p.k) + ci.b * p.sk.b + (int64_t)ci.t0 * p.sk.t + h * p.sk.h,
                        p.sk.t, ci.len);
  load_tile<T, D, true>(dW, 64, ws_tile(p.ws.w, gc), D, C);
  load_tile<T, D, true>(dV, 64, vin + ci.b * p.sv.b + (int64_t)ci.t0 * p.sv.t + h * p.sv.h, p.sv.t, ci.len);
  load_tile<T, D, true>(tile(L::kU), 64, ws_tile(p.ws.u, gc), D, C);
  load_tile<T, C, true>(tile(L::kM), C, static_cast<const T*>(p.ws.m) + ((int64_t)gc * p.H + h) * C * C, C, C);
  if constexpr (kGate) {
    if (threadIdx.x < C / 4) cp_async16(sGq + threadIdx.x * 4, p.ws.gl + ((int64_t)gc * p.HQ + hq) * C + threadIdx.x * 4, 16);
  }
  cp_async_commit();
  if (gc > first && threadIdx.x == 0) issue_chunk(1, gc - 1);

  float qf[NT][4];
  load_query_rows<T, NT>(qf, static_cast<const T*>(p.q) + ci.b * p.sq.b + (int64_t)ci.t0 * p.sq.t + hq * p.sq.h, p.sq.t,
                         r0, ci.len);
  // The query pre-multiplied by scale * log2(e): every logit below is linear in it (Eq. 12, 15, 32), so the
  // products come out in base-2 units with no per-logit multiply.
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) qf[nt][e] *= p.scale_log2;
  float o[NT][4];
  zero(o);
  OnlineSoftmax sm_state;

  cp_async_wait<0>();
  __syncthreads();

  // ---- Diagonal chunk (Eq. 12, 13), warp-level.
  diagonal_block<T, D, true, kGate>(qf, o, sm_state, dK, dW, tile(L::kU), tile(L::kM), dV, 64, C, sGq, 1.f, r0);

  // ---- Earlier chunks, right to left, on the warpgroup tensor cores.
  const QueryGate<kGate> qgate(p, gc, hq, sGq, r0);
  int st = 1;
  uint32_t phase = 0;  // bit b: parity of barrier b for its next use
  for (int c = gc - 1; c >= first; --c, st ^= 1) {
    __syncthreads();  // every warp is done with stage st ^ 1 (its wgmma waited; the diagonal's ldmatrix reads)
    if (threadIdx.x == 0) {
      // kOneE: the diagonal's W and U are read, so the E slot takes the first step's tile (only a chunk after the
      // sequence's first has a Q~ update to feed).
      if (kOneE && c == gc - 1 && bv.next_step(c) >= 0) issue_e_slot(bv.next_step(c));
      if (c > first) {
        fence_proxy_async_smem();  // those generic-proxy reads, ordered before the copy engine's writes
        issue_chunk(st ^ 1, c - 1);
      }
    }
    mbar_wait(bar(st), (phase >> st) & 1);
    phase ^= 1u << st;

    uint32_t qa[KD][4];
    to_a_frags<T, NT>(qf, qa, 1.f);
    // Descriptors of this stage's tiles; a k16 step adds 32 bytes (K-major) or 2048 bytes (V) to the start
    // address field, which holds the address in 16-byte units: +2 and +128. A product over d takes k16 step kk
    // from sub-tile kk / 4.
    auto desc = [&](int i) { return wgmma_desc_sw128(smem_addr(stage_tile(st, i))); };
    float s[NC8][4];
    wgmma_fence_operand(qf);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk)  // S = Q~ K^_c^T: a k16 step is 32 bytes along the swizzled K^ rows
      wgmma_m64n64k16_rs<0>(s, qa[kk], desc(L::kK + kk / 4) + 2 * (kk % 4), kk > 0, Tag{});
    if (bv.steps_after(c)) {  // Q~ <- Q~ + Q~ E_c^T (Eq. 32; F for a far block, Eq. 53): none after the first chunk
      if constexpr (kOneE) {  // E_c has its own barrier: S's products are already issued while it lands
        mbar_wait(bar(kEBar), (phase >> kEBar) & 1);
        phase ^= 1u << kEBar;
      }
      auto edesc = [&](int i) { return wgmma_desc_sw128(smem_addr(e_tile(st, i))); };
#pragma unroll
      for (int kk = 0; kk < KD; ++kk)  // output columns 0..63 of Q~ (E sub-tiles [0][kk / 4])
        wgmma_m64n64k16_rs<0>(qf, qa[kk], edesc(kk / 4) + 2 * (kk % 4), 1, Tag{});
      if constexpr (KH == 2) {
#pragma unroll
        for (int kk = 0; kk < KD; ++kk)  // columns 64..127: the second accumulator half (E sub-tiles [1][kk / 4])
          wgmma_m64n64k16_rs<0, 8>(qf, qa[kk], edesc(KH + kk / 4) + 2 * (kk % 4), 1, Tag{});
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(s);
    wgmma_fence_operand(qf);
    if constexpr (kOneE) {
      // The next step's tile into the slot once the whole warpgroup's update with this one is done (E_{c-1}, or
      // F of an earlier block).
      if (bv.steps_after(c) && bv.next_step(c - 1) >= 0) {
        __syncthreads();
        if (threadIdx.x == 0) issue_e_slot(bv.next_step(c - 1));
      }
    }

    float delta = 0.f;  // the gate (PaTH-FoX): G_i - G_j, offsets subtracted in f64 (docs/spec.md §6)
    if constexpr (kGate) delta = static_cast<float>(qgate.goff - p.ws.goff[(int64_t)c * p.HQ + hq]);
#pragma unroll
    for (int nt = 0; nt < NC8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kGate) {
          const int j = nt * 8 + 2 * t4 + e % 2;
          s[nt][e] += ((qgate.g[e / 2] + delta) - sGk[st * C + j]) * kLog2e;
        }
      }
    sm_state.step(s, o);
    uint32_t pa[KC][4];
    to_a_frags<T, NC8>(s, pa, 1.f);
    wgmma_fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KC; ++kk)  // O += P V_c: V is [key][d], read transposed; a k16 step is 16 rows, 2048 bytes
      wgmma_m64n64k16_rs<1>(o, pa[kk], desc(L::kV) + 128 * kk, 1, Tag{});
    if constexpr (KH == 2) {
#pragma unroll
      for (int kk = 0; kk < KC; ++kk)  // O's columns 64..127: V sub-tile 1, the second accumulator half
        wgmma_m64n64k16_rs<1, 8>(o, pa[kk], desc(L::kV + 1) + 128 * kk, 1, Tag{});
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(o);
  }

  sm_state.finish<T, NT>(o, static_cast<T*>(p.o) + ci.b * p.so.b + (int64_t)ci.t0 * p.so.t + hq * p.so.h, p.so.t,
                         p.lse + ci.b * p.slse.b + (int64_t)ci.t0 * p.slse.t + hq * p.slse.h, p.slse.t, r0, ci.len);
}

}  // namespace pathattn::cuda
