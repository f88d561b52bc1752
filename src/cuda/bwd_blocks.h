// The two-level backward's schedule (docs/math.md Eq. 54-57): a key chunk's task as a list of levels, each with its
// carried key tile, its query chunks and the step that leads to the next level, and the two block sweeps around the
// main kernel. Host and device: the main kernel (kernels/bwd_main.cuh) and the block kernels
// (kernels/bwd_block_sweep.cuh) run it; tests/cuda/test_cuda_bwd_blocks.cpp runs it on the host in f64 against the
// per-chunk backward (every gradient the main kernel hands to the chunk-local one) and checks its turns.
#pragma once

#include "cuda/fwd_blocks.h"  // PATHATTN_HD, fwd_block_start / fwd_block_end (the forward's blocks, the same ones)

namespace pathattn::cuda {

// Key chunk c's task (first, last: its sequence's chunks; block: chunks per block, 0 = off). Level i = 0 is the
// nearest. Near levels i < near: query chunk m = c + 1 + i of c's own block, met through K~_{c,m} (Eq. 18) with Q^_m;
// their step is E_m and its gradient dP_m (Eq. 33). Far levels i >= near: block mu = beta + 1 + (i - near) after
// c's block beta, every query chunk of mu met through K~_{c,s_mu} (Eq. 49) with Q'_m (Eq. 48); their step is F_mu =
// Pi_mu^T - I and its gradient dPi_mu (Eq. 50). With blocks off every level is near: the per-chunk kernel.
//   phase 1 (i = 0, 1, ..):  slot[i] = K;  K <- K + K step_i                       (Eq. 32, 49)
//   phase 2 (i = .., 1, 0):  the pairs of level i; then, for i > 0,
//                            dstep_{i-1} += E^T slot[i-1],  E <- E + E step_{i-1}^T  (Eq. 33, 50)
// so level i's step gradient comes from every task whose levels reach past it, and the farthest level's step is
// never used. Turns (deterministic mode): dQ^_m and dQ'_m of query row m share one counter and task c adds at turn
// m - 1 - c (each query row meets tasks last-chunk-first, near and far alike); dP_m has turn m - 1 - c, dPi_mu
// s_mu - 1 - c: in each, task c + 1 goes just before task c.
struct BwdLevels {
  int c, last, block;
  int near;     // levels 0 .. near - 1: chunks c + 1 .. c + near
  int far;      // levels near .. near + far - 1: blocks after c's
  int far0;     // the first chunk of the first far level's block (c's block's end + 1)
  PATHATTN_HD static BwdLevels of(int c, int first, int last, int block) {
    if (block <= 0) return {c, last, 0, last - c, 0, last + 1};
    const int e = fwd_block_end(fwd_block_start(c, first, block), last, block);
    return {c, last, block, e - c, (last - e + block - 1) / block, e + 1};
  }
  PATHATTN_HD int count() const { return near + far; }
  PATHATTN_HD bool is_far(int i) const { return i >= near; }
  // A near level's chunk m, or a far level's block start s_mu: the step's (and its gradient's) chunk.
  PATHATTN_HD int unit(int i) const { return is_far(i) ? far0 + (i - near) * block : c + 1 + i; }
  // The level's query chunks: lo .. hi.
  PATHATTN_HD int query_lo(int i) const { return unit(i); }
  PATHATTN_HD int query_hi(int i) const {
    if (!is_far(i)) return unit(i);
    const int e = unit(i) + block - 1;
    return e < last ? e : last;
  }
  // The turn at which this task adds to the level's step gradient (dP_m or dPi_mu), and to query row m's dQ.
  PATHATTN_HD int step_turn(int i) const { return unit(i) - 1 - c; }
  PATHATTN_HD int query_turn(int m) const { return m - 1 - c; }
};

// BwdLevels with the block form known at compile time: a kernel's instance without blocks (kBlocks false) then
// compiles to the per-chunk loops, with no far branch nor block arithmetic left in its registers (the two-chunk
// wgmma kernel, kernels/bwd_main_pair.cuh, runs at 253-255 registers).
template <bool kBlocks>
struct BwdLevelsOf : BwdLevels {
  PATHATTN_HD explicit BwdLevelsOf(const BwdLevels& l) : BwdLevels(l) {}
  PATHATTN_HD bool is_far(int i) const { return kBlocks && BwdLevels::is_far(i); }
  PATHATTN_HD int unit(int i) const { return kBlocks ? BwdLevels::unit(i) : c + 1 + i; }
  PATHATTN_HD int query_lo(int i) const { return unit(i); }
  PATHATTN_HD int query_hi(int i) const { return kBlocks ? BwdLevels::query_hi(i) : unit(i); }
  PATHATTN_HD int step_turn(int i) const { return unit(i) - 1 - c; }
};

// The block sweeps of one block s .. e of a sequence first .. last (blocks on): the block preprocess (before the
// main kernel: S_m, Q'_m, F) and the block gradient sweep (after it: dPi and dQ' back into dP and dQ^). A sequence's
// first block has neither: no query of it meets a far key chunk, no task steps over it. F is formed for blocks
// that are neither the first nor the last (the last is no task's step: nothing lies after it); dPi likewise (zero
// in the last).
struct BwdBlockItem {
  bool skip;
  bool has_step;  // F formed / dPi read
  int s, e;
};
PATHATTN_HD BwdBlockItem bwd_block_item(int s, int first, int last, int block) {
  const int e = fwd_block_end(s, last, block);
  return {s == first, s != first && e != last, s, e};
}

}  // namespace pathattn::cuda
