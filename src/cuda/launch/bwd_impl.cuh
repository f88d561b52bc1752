// Launches the backward's own kernels (kernels/bwd_prep.cuh, bwd_main*.cuh, bwd_local.cuh) and sizes their
// persistent grids: as many CTAs as fit on the device at once, since the main kernel's CTAs wait for each other
// (all must be resident) and each owns a scratch slot. Included by bwd_<dtype>_<D>.cu, one instance list each, so
// that the four (dtype, D) builds of these large kernels compile in parallel.
#pragma once

#include <string>
#include <type_traits>

#include "common/env.h"
#include "cuda/check.h"
#include "cuda/kernels/bwd_block_sweep.cuh"
#include "cuda/kernels/bwd_local.cuh"
#include "cuda/kernels/bwd_main.cuh"
#include "cuda/kernels/bwd_main_pair.cuh"
#include "cuda/kernels/bwd_main_wide.cuh"
#include "cuda/kernels/bwd_prep.cuh"
#include "cuda/launch/launch.h"
#include "cuda/plan.h"
#include "cuda/tensor_maps.h"

namespace pathattn::cuda {
namespace bwd_launch_detail {

inline int sm_count() {
  int dev = 0, n = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

template <typename K>
inline int resident(K kernel, int threads, int bytes, const char* name) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes));
  if (per_sm < 1) throw RuntimeError(std::string("pathattn: ") + name + " does not fit on this device");
  return per_sm * sm_count();
}

// The main kernel: at D = 64 the two-key-chunk wgmma kernel (bwd_main_pair.cuh: bwd_main det / fast 56.2 / 35.0 ms
// at 32 x 4096 against the mma.sync kernel's ~75 / ~57, docs/perf/notes.md v4, v10, v11), at D = 128 the
// column-split wgmma kernel (bwd_main_wide.cuh, notes.md v13: on an H100, 131.8 / 96.3 -> 120.1 / 78.1 ms at
// 32 x 4096, H 16), unless PATHATTN_BWD_MAIN=mma asks for the mma.sync one (bwd_main.cuh) at both D, for
// side-by-side timing. D = 128 also runs the mma.sync kernel where the wgmma one's shared memory (which grows with
// the gate's per-head column sums) does not fit the device. The two-level backward (PATHATTN_BWD_BLOCK, plan.h
// bwd_block_setting) runs in the wgmma kernels too, in the two-chunk one (D = 64) with an even block size only
// (plan.h bwd_blocks_need_mma: an odd size at D = 64 runs the mma.sync kernel).
// PATHATTN_BWD_MAIN: auto (the default: the wgmma kernels, but the mma.sync one for D = 128 deterministic calls with
// blocks and the atomic turns, BwdGrid::mma_ctas_for_blocks), wgmma (always), mma (always).
inline const std::string& main_setting() {
  static const std::string s = env::choice("PATHATTN_BWD_MAIN", {"auto", "wgmma", "mma"}, "auto");
  return s;
}
// PATHATTN_BWD_TURNS: how the deterministic mode's ordered tiles go out in the wgmma kernels (bwd_main_pair.cuh at
// D = 64, bwd_main_wide.cuh at D = 128): atomic (every warp's float4 atomics, then its fence and pass) or bulk
// (staged in shared memory, and the copy engine adds the tile in the adding warp's or warpgroup's turn: the kernels'
// kBulk); auto (the default): bulk at both D. Measured on an H100 (docs/perf/notes.md v20, v21), the same bits as the
// atomic form, memcheck and racecheck clean: the wide kernel's bulk turns cut bwd_main det 74.1 -> 49.8 ms at
// 32 x 4096 (H 16) against the mma.sync kernel that atomic D = 128 calls with blocks run
// (BwdGrid::mma_ctas_for_blocks); the pair kernel's per-warp bulk turns 37.2 -> 29.8 at D = 64 (H 32), 133.9 -> 107.2
// at 8 x 16384. The atomic form stays as the opt-out and as the baseline of A/B runs.
inline bool turns_bulk() {
  static const std::string s = env::choice("PATHATTN_BWD_TURNS", {"auto", "atomic", "bulk"}, "auto");
  return s != "atomic";
}
inline bool mma_main_forced(int D) { return main_setting() == "mma" || bwd_blocks_need_mma(D); }
inline bool fits_smem(int bytes) {
  int dev = 0, most = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return bytes <= most;
}

// The chunk-local kernel's products: one plain TF32 product each for bf16 inputs, 3xTF32 (~f32) for f16
// (bwd_local.cuh, Exact's kTf32). Measured on the H200 (docs/perf/notes.md, "bwd_local in plain TF32"): bwd_local
// 63.9 -> 45.9 ms at 32 x 4096, D 64 (44.7 -> 39.1 at D 128), every backward test passing either way; but with f16
// inputs, whose 11 significant bits are TF32's own, dw and dbeta came to 0.96 of their bound at T = 1000 (0.77
// with 3xTF32), while bf16's 8 bits leave TF32 products 8x more precise than the inputs (bf16 cases unchanged,
// 0.77 either way). PATHATTN_BWD_LOCAL=3x / =tf32 forces one kind for every dtype (A/B runs).
template <typename T>
bool local_tf32() {
  static const int forced = [] {
    const std::string e = env::choice("PATHATTN_BWD_LOCAL", {"tf32", "3x"}, "");
    return e.empty() ? -1 : e == "tf32" ? 1 : 0;
  }();
  return forced < 0 ? std::is_same_v<T, __nv_bfloat16> : forced == 1;
}
template <typename T, int D, bool kGate>
auto local_instance() {
  return local_tf32<T>() ? bwd_local_kernel<T, D, kGate, true> : bwd_local_kernel<T, D, kGate, false>;
}

}  // namespace bwd_launch_detail

template <typename T, int D, bool kGate, bool kDet>
BwdGrid bwd_grid(int group) {
  BwdGrid g;
  const bool wgmma = !bwd_launch_detail::mma_main_forced(D);
  g.pair_main = D == 64 && wgmma;
  g.wide_main = D == 128 && wgmma && bwd_launch_detail::fits_smem(BwdWideSmem::bytes(group, kGate));
  if constexpr (D == 64) {  // (each D's TU compiles its own wgmma kernel only)
    if (g.pair_main) {
      const bool bulk = kDet && bwd_launch_detail::turns_bulk();
      g.main_ctas = bulk ? bwd_launch_detail::resident(bwd_main_pair_kernel<T, kGate, kDet, false, kDet>, 256,
                                                       BwdPairSmem::bytes(group, kGate, kDet, true), "bwd_main_pair_kernel")
                         : bwd_launch_detail::resident(bwd_main_pair_kernel<T, kGate, kDet, false>, 256,
                                                       BwdPairSmem::bytes(group, kGate, kDet, false), "bwd_main_pair_kernel");
    }
  } else {
    const bool bulk = kDet && bwd_launch_detail::turns_bulk();
    if (g.wide_main)
      g.main_ctas = bulk ? bwd_launch_detail::resident(bwd_main_wide_kernel<T, kGate, kDet, false, kDet>, 256,
                                                       BwdWideSmem::bytes(group, kGate), "bwd_main_wide_kernel")
                         : bwd_launch_detail::resident(bwd_main_wide_kernel<T, kGate, kDet, false>, 256,
                                                       BwdWideSmem::bytes(group, kGate), "bwd_main_wide_kernel");
    // The deterministic mode with blocks and the atomic turns: the mma.sync kernel, measured on an H100
    // (thirty-first session, docs/perf/results.md; bwd det with blocks of 8, mma.sync against wide): 129.5 against
    // 137.6 ms at 32 x 4096, 335.8 against 350.6 at 8 x 16384 (H 16): the wide kernel's eight warps per turn cost
    // more there than its products save (its fast mode is faster: 88.9 against 106.2, so the fast mode keeps it).
    // With the bulk turns (two passes per turn) the wide kernel is faster (105.6 against 128.7, notes.md v20).
    if (g.wide_main && kDet && !bulk && bwd_launch_detail::main_setting() == "auto")
      g.mma_ctas_for_blocks = bwd_launch_detail::resident(bwd_main_kernel<T, D, kGate, kDet>, 128,
                                                          BwdMainSmem<D>::bytes(group, kGate), "bwd_main_kernel");
  }
  if (!g.pair_main && !g.wide_main)
    g.main_ctas = bwd_launch_detail::resident(bwd_main_kernel<T, D, kGate, kDet>, 128, BwdMainSmem<D>::bytes(group, kGate),
                                              "bwd_main_kernel");
  g.local_ctas = bwd_launch_detail::resident(bwd_launch_detail::local_instance<T, D, kGate>(), local_detail::LocalTiles<D>::kThreads,
                                             bwd_local_smem_bytes<D>(), "bwd_local_kernel");
  return g;
}

template <typename T, int D, bool kGate, bool kDet>
void launch_bwd(const BwdParams& p, const BwdGrid& grid, cudaStream_t stream, const StageMark& mark) {
  {
    constexpr int bytes = BwdPrepSmem<D>::kBytes;
    CUDA_CHECK(cudaFuncSetAttribute(bwd_prep_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    bwd_prep_kernel<T, D><<<dim3(p.num_chunks, p.HQ), 128, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("bwd_prep_kernel");
  }
  mark("bwd_prep");
  if (p.carry_block > 0) {  // the two-level backward's block preprocess (Eq. 54, 55): S_m, Q'_m, F
    if (grid.pair_main && p.carry_block % 2 != 0)
      throw RuntimeError("pathattn: the two-chunk backward kernel needs an even block size (plan.h bwd_block_for)");
    constexpr int bytes = BwdBlockSmem<D>::kPrepBytes;
    CUDA_CHECK(cudaFuncSetAttribute(bwd_block_prep_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    bwd_block_prep_kernel<T, D><<<dim3(p.num_blocks, p.H), 2 * D, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("bwd_block_prep_kernel");
    mark("bwd_blocks");
  }
  if (grid.pair_main || grid.wide_main) {
    // The tiles the wgmma kernels stream, as [rows, D] matrices read in 64 x 64 boxes (128-byte swizzle).
    const int64_t q_rows = static_cast<int64_t>(p.num_chunks) * p.HQ * kChunk;
    const CUtensorMap tm_q = tensor_map_2d(p.qhat, q_rows, D, D, 64, 64, "the Q^ workspace");
    const CUtensorMap tm_do = tensor_map_2d(p.dohat, q_rows, D, D, 64, 64, "the dO^ workspace");
    const CUtensorMap tm_step =
        tensor_map_2d(p.ws.step, static_cast<int64_t>(p.num_chunks) * p.H * D, D, D, 64, 64, "the E workspace");
    const CUtensorMap tm_slot = tensor_map_2d(p.slots, static_cast<int64_t>(main_slots(grid)) * p.slot_chunks * kChunk, D,
                                              D, 64, 64, "the backward's slots");
    // The two-level backward's Q' and block steps F (the same shapes as Q^ and E; with blocks off, unread).
    const bool blocks_on = p.carry_block > 0;
    const int64_t f_rows = static_cast<int64_t>(p.num_blocks) * p.H * D;
    const CUtensorMap tm_qfar = far_map(blocks_on, p.qfar, q_rows, D, tm_q, "the Q' workspace");
    const CUtensorMap tm_bstep = far_map(blocks_on, p.blockstep, f_rows, D, tm_step, "the block steps' workspace");
    // The bulk form of the turns (deterministic calls; the default, PATHATTN_BWD_TURNS=atomic turns it off): the f32
    // accumulators it reduces into, as [rows, D] maps of box_rows x 32 boxes: a warp's 16 rows in the two-chunk kernel,
    // whose warps add on their own, a warpgroup's 64 in the wide one (without blocks the far maps repeat the near ones,
    // unread).
    const bool bulk = kDet && bwd_launch_detail::turns_bulk();
    BwdTurnMaps tmaps{};
    if (bulk) {
      const int64_t p_rows = static_cast<int64_t>(p.num_chunks) * p.H * D;
      constexpr int box_rows = D == 64 ? 16 : 64;
      tmaps.dq = tensor_map_2d_f32(p.dqacc, q_rows, D, box_rows, 32, "the dQ^ accumulator");
      tmaps.dqfar = blocks_on ? tensor_map_2d_f32(p.dqfar, q_rows, D, box_rows, 32, "the dQ' accumulator") : tmaps.dq;
      tmaps.dp = tensor_map_2d_f32(p.dpacc, p_rows, D, box_rows, 32, "the dP accumulator");
      tmaps.dpi = blocks_on ? tensor_map_2d_f32(p.dpiacc, f_rows, D, box_rows, 32, "the dPi accumulator") : tmaps.dp;
    }
    if constexpr (D == 64) {
      const int bytes = BwdPairSmem::bytes(p.group, kGate, kDet, bulk);
      const auto kernel = bulk ? (blocks_on ? bwd_main_pair_kernel<T, kGate, kDet, true, kDet>
                                            : bwd_main_pair_kernel<T, kGate, kDet, false, kDet>)
                               : (blocks_on ? bwd_main_pair_kernel<T, kGate, kDet, true>
                                            : bwd_main_pair_kernel<T, kGate, kDet, false>);
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      kernel<<<grid.main_ctas, 256, bytes, stream>>>(p, tm_q, tm_do, tm_step, tm_slot, tm_qfar, tm_bstep, tmaps);
      CUDA_CHECK_LAUNCH(bulk ? "bwd_main_pair_kernel (bulk turns)" : "bwd_main_pair_kernel");
    } else {
      const int bytes = BwdWideSmem::bytes(p.group, kGate);
      const auto kernel = bulk ? (blocks_on ? bwd_main_wide_kernel<T, kGate, kDet, true, kDet>
                                            : bwd_main_wide_kernel<T, kGate, kDet, false, kDet>)
                               : (blocks_on ? bwd_main_wide_kernel<T, kGate, kDet, true>
                                            : bwd_main_wide_kernel<T, kGate, kDet, false>);
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      kernel<<<grid.main_ctas, 256, bytes, stream>>>(p, tm_q, tm_do, tm_step, tm_slot, tm_qfar, tm_bstep, tmaps);
      CUDA_CHECK_LAUNCH(bulk ? "bwd_main_wide_kernel (bulk turns)" : "bwd_main_wide_kernel");
    }
  } else {
    const int bytes = BwdMainSmem<D>::bytes(p.group, kGate);
    CUDA_CHECK(cudaFuncSetAttribute(bwd_main_kernel<T, D, kGate, kDet>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    bwd_main_kernel<T, D, kGate, kDet><<<grid.main_ctas, 128, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("bwd_main_kernel");
  }
  mark("bwd_main");
  if (p.carry_block > 0) {  // dPi and dQ' back into dP and dQ^ (Eq. 56, 57), before the chunk-local kernel reads them
    constexpr int bytes = BwdBlockSmem<D>::kGradBytes;
    CUDA_CHECK(cudaFuncSetAttribute(bwd_block_grad_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    bwd_block_grad_kernel<T, D><<<dim3(p.num_blocks, p.H), 2 * D, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("bwd_block_grad_kernel");
    mark("bwd_bgrad");
  }
  {
    constexpr int bytes = bwd_local_smem_bytes<D>();
    const auto kernel = bwd_launch_detail::local_instance<T, D, kGate>();
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    kernel<<<grid.local_ctas, local_detail::LocalTiles<D>::kThreads, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("bwd_local_kernel");
  }
  mark("bwd_local");
  if constexpr (kGate) launch_bwd_gate(p, stream);
  mark("bwd_gate");
}

#define PATHATTN_BWD(T, D, G, DET)                             \
  template BwdGrid bwd_grid<T, D, G, DET>(int);                \
  template void launch_bwd<T, D, G, DET>(const BwdParams&, const BwdGrid&, cudaStream_t, const StageMark&);
#define PATHATTN_BWD_ALL(T, D)      \
  PATHATTN_BWD(T, D, false, false)  \
  PATHATTN_BWD(T, D, false, true)   \
  PATHATTN_BWD(T, D, true, false)   \
  PATHATTN_BWD(T, D, true, true)

}  // namespace pathattn::cuda
