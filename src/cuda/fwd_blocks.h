// The two-level forward's schedule (docs/math.md Eq. 51-53): which chunks a query meets through K' and where its
// query steps by E or by a block's F (fwd_wgmma.cuh), and which E each item of the block preprocess steps through
// (fwd_block_carry.cuh). Host and device: the kernels run it, tests/cuda/test_cuda_fwd_blocks.cpp checks it on the
// host against the per-chunk forward (every query's logits, in f64).
#pragma once

#include "cuda/host_device.h"

namespace pathattn::cuda {

// The first chunk of c's block (blocks of `block` chunks from the sequence's first chunk; block > 0), and the last
// chunk of the block that starts at s (the sequence's last chunk bounds it).
PATHATTN_HD int fwd_block_start(int c, int first, int block) { return first + (c - first) / block * block; }
PATHATTN_HD int fwd_block_end(int s, int last, int block) { return s + block - 1 < last ? s + block - 1 : last; }

// One query chunk's view of its sequence (global chunk indices; first: the sequence's first chunk; block = B chunks
// per block, 0 = off: every chunk near).
struct FwdBlockView {
  int first, near0, block;
  PATHATTN_HD static FwdBlockView of(int first, int query_chunk, int block) {
    return {first, block > 0 ? fwd_block_start(query_chunk, first, block) : first, block};
  }
  // The first chunk of c's block (the sequence's first chunk when blocks are off).
  PATHATTN_HD int block_start(int c) const { return block > 0 ? fwd_block_start(c, first, block) : first; }
  // c lies in an earlier block than the query: met through K'_c (Eq. 51).
  PATHATTN_HD bool far(int c) const { return c < near0; }
  // Whether the query steps after key chunk c: by E_c for a chunk of its own block (Eq. 32), by F of c's block
  // after a far block's first chunk (Eq. 53); never after the sequence's first chunk.
  PATHATTN_HD bool steps_after(int c) const { return c > first && (!far(c) || c == block_start(c)); }
  // The last chunk at or before c after which the query steps, -1 if none: the order the step tiles are used in.
  PATHATTN_HD int next_step(int c) const {
    const int n = far(c) ? block_start(c) : c;
    return n > first ? n : -1;
  }
};

// One item of the item form of the block preprocess (fwd_block_carry_kernel, PATHATTN_FWD_BLOCK_CARRY=items): X
// steps through E_j for j = j0, j0 + dir, .., j1 (`steps` of them).
struct BlockCarryItem {
  bool skip;  // nothing reads the item's result
  int j0, j1, dir;
  PATHATTN_HD int steps() const { return skip ? 0 : (j1 - j0) * dir + 1; }
};

// K'_c (Eq. 52): K^_c's rows through X <- X + X E_j for j = c + 1 .. e (the block's last chunk). Skipped in a
// sequence's last block (no query lies in a later one). first, last: c's sequence's chunks.
PATHATTN_HD BlockCarryItem key_carry_item(int c, int first, int last, int block) {
  const int e = fwd_block_end(fwd_block_start(c, first, block), last, block);
  return {e == last, c + 1, e, 1};
}

// F of the block that starts at chunk s (Eq. 53): rows of I through X <- X + X E_j^T for j = e .. s, then
// F = X^T - I. Skipped for a sequence's first block (a query leaves it with no step) and its last.
PATHATTN_HD BlockCarryItem block_step_item(int s, int first, int last, int block) {
  const int e = fwd_block_end(s, last, block);
  return {s == first || e == last, e, s, -1};
}

// The sweep form of the block preprocess (fwd_block_sweep_kernel, the default): one item per block walks its
// chunks from the last to the first with X = R_c^T, R_c = P_{c+1}^T .. P_e^T (R_e = I): K'_c = K^_c X^T (Eq. 52),
// then X <- X + X E_c^T; after the block's first chunk X = Pi_b and F = X^T - I (Eq. 53). Each E is read once per
// block, against (B - 1) / 2 times per chunk by the items above.
struct BlockSweepItem {
  bool skip;    // a sequence's last block: nothing reads its K' or F
  bool need_f;  // F is read (not the sequence's first block)
  int s, e;     // the block's chunks
  // Whether X steps through E_c after K'_c (the block's first chunk only when F is wanted).
  PATHATTN_HD bool steps_after(int c) const { return c > s || need_f; }
};
PATHATTN_HD BlockSweepItem block_sweep_item(int s, int first, int last, int block) {
  const int e = fwd_block_end(s, last, block);
  return {e == last, s != first && e != last, s, e};
}

}  // namespace pathattn::cuda
