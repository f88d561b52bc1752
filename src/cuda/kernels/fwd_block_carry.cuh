// The two-level forward's block preprocess (docs/math.md section 8, Eq. 52, 53; env PATHATTN_FWD_BLOCK): per kv head,
// from the UT preprocess's K^ and E (prep_tc.cuh), for every block of carry_block chunks
//
//   K'_c = K^_c P_{c+1}^T ... P_{e}^T    for each chunk c of the block (e: the block's last chunk)      (Eq. 52)
//          X <- X + X E_j  for j = c+1 .. e  (P_j^T = I + E_j),  X = K^_c's C rows
//   F_b  = Pi_b^T - I,  Pi_b = P_e ... P_s                                                             (Eq. 53)
//          X <- X + X E_j^T for j = e .. s,  X = rows 64 r.. of I;  F's columns 64 r.. = X^T - I
//
// so that the main kernel (fwd_wgmma.cuh) meets the keys of an earlier block through K' with one step per block.
// Only what a later block reads is formed: no K' for the chunks of a sequence's last block, no F for its first block
// (a query leaves the sequence's first block with no step) or its last (no query lies after it).
//
// One CTA of 4 warps per (work item, kv head): grid.x = NC (K' items, chunk c) + num_blocks * KH (F items, block b
// and row tile r); warp w owns rows 16 w.. of the item's 64-row X, kept in f32 registers (accumulator layout) and
// rounded to the tensor-core dtype only as the A operand of each product, as the main kernels carry Q~ (docs/spec.md
// §6). E_j streams through two shared-memory stages (cp.async), j + 1 loading while j computes. Products by
// mma.sync through fwd_tiles.cuh's gemm_nn / gemm_nt on row-padded tiles (fwd.cuh's layout).
#pragma once

#include "cuda/fwd_blocks.h"
#include "cuda/kernels/fwd_tiles.cuh"

namespace pathattn::cuda {

// This thread's entries of rows r0, r0 + 8 (r0 = 16 warp + lane / 4, offset by row0) of a D x D matrix held in the
// accumulator layout [16 x D] per warp: the identity (X's start), and F = X^T - I written out (F_b from X = Pi_b).
template <int NT>
__device__ __forceinline__ void identity_rows(float (&x)[NT][4], int row0) {
  const int lane = threadIdx.x % 32, r0 = row0 + (threadIdx.x / 32 % 4) * 16 + lane / 4, t4 = lane % 4;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nt][e] = (r0 + (e / 2) * 8 == nt * 8 + 2 * t4 + e % 2) ? 1.f : 0.f;
}
template <typename T, int NT>
__device__ __forceinline__ void store_block_step(T* f, const float (&x)[NT][4], int row0) {
  constexpr int D = 8 * NT;
  const int lane = threadIdx.x % 32, r0 = row0 + (threadIdx.x / 32 % 4) * 16 + lane / 4, t4 = lane % 4;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = r0 + (e / 2) * 8, col = nt * 8 + 2 * t4 + e % 2;
      f[col * D + row] = TypeTraits<T>::from_float(x[nt][e] - (row == col ? 1.f : 0.f));
    }
}

template <int D>
struct BlockCarrySmem {
  static constexpr int LD = D + 8;                // rows padded by 16 bytes (fwd.cuh: conflict-free ldmatrix)
  static constexpr int kStage = D * LD;           // one E (D x D) per stage
  static constexpr int kBytes = 2 * kStage * 2;   // two stages of 16-bit elements
};

template <typename T, int D>
__global__ void __launch_bounds__(128) fwd_block_carry_kernel(FwdParams p) {
  using namespace fwd_detail;
  using S = BlockCarrySmem<D>;
  constexpr int C = kChunk, LD = S::LD, NT = D / 8, KD = D / 16, KH = D / 64;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sm = reinterpret_cast<T*>(smem_raw);
  auto stage = [&](int s) { return sm + s * S::kStage; };

  const int h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int r0 = warp * 16 + g;  // this thread's rows of X: r0, r0 + 8
  const int Bk = p.carry_block;
  const T* wsE = static_cast<const T*>(p.ws.step);

  // The item (cuda/fwd_blocks.h): which chunks' E it steps through, in which order, and whether as X E (keys) or
  // X E^T (a block step); none that nothing reads.
  const bool keys = static_cast<int>(blockIdx.x) < p.num_chunks;
  int rt = 0, blk = 0;
  BlockCarryItem it;
  if (keys) {
    const int c = blockIdx.x;
    const ChunkInfo ci = p.chunks[c];
    it = key_carry_item(c, ci.first, ci.last, Bk);
  } else {
    const int item = blockIdx.x - p.num_chunks;
    blk = item / KH, rt = item % KH;
    if (blk >= p.num_blocks) return;
    const int s = p.blk_start[blk];
    const ChunkInfo ci = p.chunks[s];
    it = block_step_item(s, ci.first, ci.last, Bk);
  }
  if (it.skip) return;
  const int j0 = it.j0, dir = it.dir, steps = it.steps();  // E_j for j = j0, j0 + dir, .. (steps >= 0)

  // X: K^_c's rows (keys) or rows 64 rt.. of the identity (block step).
  float x[NT][4];
  if (keys) {
    const T* kh = static_cast<const T*>(p.ws.khat) + ((int64_t)blockIdx.x * p.H + h) * C * D;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = r0 + (e / 2) * 8, col = nt * 8 + 2 * t4 + e % 2;
        x[nt][e] = TypeTraits<T>::to_float(kh[row * D + col]);
      }
  } else {
    identity_rows(x, 64 * rt);
  }

  auto issue = [&](int s, int j) {  // E_j (D rows) into stage s, as C-row tiles
    const T* ej = wsE + ((int64_t)j * p.H + h) * D * D;
#pragma unroll
    for (int r = 0; r < D; r += C) load_tile<T, D, false>(stage(s) + r * LD, LD, ej + r * D, D, C);
    cp_async_commit();
  };
  if (steps > 0) issue(0, j0);
  for (int i = 0; i < steps; ++i) {
    const int j = j0 + i * dir;
    if (i + 1 < steps) {
      issue((i + 1) & 1, j + dir);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // E_j in stage i & 1 is visible to every warp
    uint32_t xa[KD][4];
    to_a_frags<T, NT>(x, xa, 1.f);
    if (keys)
      gemm_nn<T, NT, KD, false>(x, xa, stage(i & 1), LD);  // X <- X + X E_j (Eq. 52)
    else
      gemm_nt<T, NT, KD, false>(x, xa, stage(i & 1), LD);  // X <- X + X E_j^T (Eq. 53)
    __syncthreads();  // every warp is done with stage i & 1 before it is loaded again
  }

  if (keys) {  // K'_c, rows past the chunk's end stay zero (K^'s are)
    T* kf = static_cast<T*>(p.kfar) + ((int64_t)blockIdx.x * p.H + h) * C * D;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = r0 + half * 8, col = nt * 8 + 2 * t4;
        *reinterpret_cast<uint32_t*>(kf + row * D + col) = TypeTraits<T>::pack(x[nt][2 * half], x[nt][2 * half + 1]);
      }
  } else {  // F_b[d][d'] = Pi_b[d'][d] - [d == d'] for this tile's rows d' of Pi_b
    store_block_step(static_cast<T*>(p.blockstep) + ((int64_t)blk * p.H + h) * D * D, x, 64 * rt);
  }
}

// The sweep form (the default; cuda/fwd_blocks.h BlockSweepItem): a CTA per (block, kv head) walks the block's
// chunks from its last to its first with X = R_c^T, R_c = P_{c+1}^T .. P_e^T (R_e = I), in f32 registers (warp w: 16
// rows of X):
//   K'_c = K^_c X^T          (X through shared memory in the tensor-core dtype as the B operand; the 4 warps of a
//                             64-row tile of X form K''s 64 columns of those rows, warp w K^'s rows 16 (w % 4)..)  (Eq. 52)
//   X <- X + X E_c^T          (E_c double-buffered by cp.async, E_{c-1} loading meanwhile)
// and after the first chunk F = X^T - I (Eq. 53). Per chunk one D x D x D and one C x D x D product, each E read once
// per block; the items' form costs (B - 1) / 2 C x D x D products per chunk and D / 64 per chunk for F, and reads an
// E for each. X's rows evolve independently, so the CTA may hold all D / 64 row tiles (kTiles = D / 64, 2 D threads:
// the default, measured) or one (kTiles = 1, grid.z = D / 64, PATHATTN_FWD_BLOCK_CARRY=split: at D = 128 twice the
// CTAs, each half the chain, for a stage that measured latency-bound, thirtieth session; unrun). At D = 64 both are
// one tile.
template <int D, int kTiles>
struct BlockSweepSmem {
  static constexpr int LD = D + 8;
  static constexpr int kTile = D * LD;                      // one D x D matrix, rows padded
  static constexpr int kBytes = (kTiles * 64 * LD + 2 * kTile) * 2;  // X's rows, then two stages of E
};

// The item of block blk (a CTA's grid.x in the block kernels here and in bwd_block_sweep.cuh): item_of(the block's
// first chunk, its sequence's first and last chunks, the block size).
template <typename ItemOf>
__device__ __forceinline__ auto block_item_of(const FwdParams& p, int blk, ItemOf item_of) {
  const int s0 = p.blk_start[blk];
  const ChunkInfo ci = p.chunks[s0];
  return item_of(s0, ci.first, ci.last, p.carry_block);
}

template <typename T, int D, int kTiles>
__global__ void __launch_bounds__(128 * kTiles) fwd_block_sweep_kernel(FwdParams p) {
  using namespace fwd_detail;
  using S = BlockSweepSmem<D, kTiles>;
  constexpr int C = kChunk, LD = S::LD, NT = D / 8, KD = D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sX = reinterpret_cast<T*>(smem_raw);
  auto sE = [&](int st) { return sX + kTiles * 64 * LD + st * S::kTile; };

  const int h = blockIdx.y, blk = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const BlockSweepItem it = block_item_of(p, blk, block_sweep_item);
  if (it.skip) return;
  const T* wsE = static_cast<const T*>(p.ws.step);
  auto issue = [&](int st, int j) {  // E_j (D rows) into stage st, as C-row tiles
    const T* ej = wsE + ((int64_t)j * p.H + h) * D * D;
#pragma unroll
    for (int r = 0; r < D; r += C) load_tile<T, D, false>(sE(st) + r * LD, LD, ej + r * D, D, C);
    cp_async_commit();
  };

  // X = I: this warp's rows 64 tile + 16 (warp % 4).. of the D x D matrix, rows 16 warp.. of the CTA's (xr0).
  const int tile = (kTiles == D / 64 ? 0 : blockIdx.z * kTiles) + warp / 4;  // (one CTA: grid.z = 1)
  const int xr0 = warp * 16 + g;
  float x[NT][4];
  identity_rows(x, 64 * tile);

  // The K' product's share of this warp: K^'s rows 16 (warp % 4).., columns 64 tile.. (D = 64: all of them).
  const int kr0 = (warp % 4) * 16 + g, kc0 = 64 * tile;
  if (it.steps_after(it.e)) issue(0, it.e);
  for (int c = it.e, i = 0; c >= it.s; --c, ++i) {
    const bool next = c - 1 >= it.s && it.steps_after(c - 1);
    if (next) {
      issue((i + 1) & 1, c - 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    // X into shared memory as the K' product's B operand ([n = d'][k = d]: X's rows as they are).
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<uint32_t*>(sX + (xr0 + 8 * half) * LD + nt * 8 + 2 * t4) =
            TypeTraits<T>::pack(x[nt][2 * half], x[nt][2 * half + 1]);
    __syncthreads();  // X stored by every warp, E_c landed for every warp
    {  // K'_c = K^_c X^T (4 warps per 64 columns of K', those of their rows of X)
      const T* kh = static_cast<const T*>(p.ws.khat) + ((int64_t)c * p.H + h) * C * D;
      float kf[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) kf[nt][e] = TypeTraits<T>::to_float(kh[(kr0 + (e / 2) * 8) * D + nt * 8 + 2 * t4 + e % 2]);
      uint32_t ka[KD][4];
      to_a_frags<T, NT>(kf, ka, 1.f);
      float out[8][4];
      zero(out);
      gemm_nt<T, 8, KD, false>(out, ka, sX + (warp / 4) * 64 * LD, LD);
      T* kfar = static_cast<T*>(p.kfar) + ((int64_t)c * p.H + h) * C * D;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          *reinterpret_cast<uint32_t*>(kfar + (kr0 + 8 * half) * D + kc0 + nt * 8 + 2 * t4) =
              TypeTraits<T>::pack(out[nt][2 * half], out[nt][2 * half + 1]);
    }
    if (it.steps_after(c)) {  // X <- X + X E_c^T
      uint32_t xa[KD][4];
      to_a_frags<T, NT>(x, xa, 1.f);
      gemm_nt<T, NT, KD, false>(x, xa, sE(i & 1), LD);
    }
    __syncthreads();  // every warp is done with X in shared memory and with stage i & 1 before they are written again
  }

  if (it.need_f)  // F_b = Pi_b^T - I, Pi_b = X
    store_block_step(static_cast<T*>(p.blockstep) + ((int64_t)blk * p.H + h) * D * D, x, 64 * tile);
}

}  // namespace pathattn::cuda
