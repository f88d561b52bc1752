// The two-level forward's schedule (src/cuda/fwd_blocks.h, which fwd_wgmma.cuh and fwd_block_carry.cuh run) against
// the per-chunk forward, on the host in f64 (label cpu): the logits of every (query chunk, key chunk) pair of one
// sequence, from the CPU core's chunk factors (src/cpu/chunk.h), with the block preprocess's items and the main
// kernel's near / far / step decisions taken from the header and the products done here as the kernels do them
// (the item form: X <- X + X E_j for K', X <- X + X E_j^T then F = X^T - I for a block step; the sweep form: X = R^T
// from I, K'_c = K^_c X^T, X <- X + X E_c^T, F = X^T - I; then Q~ <- Q~ + Q~ F^T). What nothing may read is NaN, so a
// read of a skipped item fails. Also: the one-E-slot kernel's order of step tiles (each tile it
// waits for is the one it issued last).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cuda/fwd_blocks.h"
#include "cuda/block_sequence.h"

namespace pathattn::cuda {
namespace {

using namespace block_test;

enum class Form { items, sweep };

// Per query chunk m, the logits against every earlier key chunk: per chunk (block = 0) or two-level, with the block
// preprocess in either form.
std::vector<Mat> pair_logits(const Sequence& s, int m, int block, Form form = Form::sweep) {
  const int D = s.D, last = s.last;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto at = [&](int c) { return c - s.first; };
  // The block preprocess: K' per chunk, F per block start (NaN where the item is skipped: never to be read).
  std::vector<Mat> kfar(s.khat.size(), Mat(C * D, nan)), fstep(s.khat.size(), Mat(D * D, nan));
  if (block > 0 && form == Form::sweep)
    for (int s0 = s.first; s0 <= last; s0 += block) {
      const BlockSweepItem it = block_sweep_item(s0, s.first, last, block);
      if (it.skip) continue;
      Mat x = identity(D);  // X = R_c^T
      for (int c = it.e; c >= it.s; --c) {
        Mat xt(D * D);  // K'_c = K^_c X^T: logits() multiplies by its second argument's transpose
        for (int a = 0; a < D; ++a)
          for (int b = 0; b < D; ++b) xt[a * D + b] = x[b * D + a];
        Mat kf(C * D, 0.0);
        for (int r = 0; r < C; ++r)
          for (int j = 0; j < D; ++j)
            for (int k = 0; k < D; ++k) kf[r * D + j] += s.khat[at(c)][r * D + k] * x[j * D + k];
        kfar[at(c)] = kf;
        if (it.steps_after(c)) step(x, s.e[at(c)], D, true);
      }
      if (it.need_f) fstep[at(s0)] = block_step_from(x, D);
    }
  if (block > 0 && form == Form::items)
    for (int c = s.first; c <= last; ++c) {
      const BlockCarryItem ki = key_carry_item(c, s.first, last, block);
      if (!ki.skip) {
        Mat x = s.khat[at(c)];
        for (int i = 0, j = ki.j0; i < ki.steps(); ++i, j += ki.dir) step(x, s.e[at(j)], D, false);
        kfar[at(c)] = x;
      }
      if ((c - s.first) % block == 0) {  // a block start (the kernel takes them from the plan's blk_start)
        const BlockCarryItem fi = block_step_item(c, s.first, last, block);
        if (!fi.skip) {
          Mat x = identity(D);
          for (int i = 0, j = fi.j0; i < fi.steps(); ++i, j += fi.dir) step(x, s.e[at(j)], D, true);
          fstep[at(c)] = block_step_from(x, D);
        }
      }
    }
  // The main kernel's loop over key chunks, with its one-E-slot kernel's tile order.
  const FwdBlockView bv = FwdBlockView::of(s.first, m, block);
  std::vector<Mat> out;
  Mat q = s.qhat[at(m)];
  int slot = m - 1 >= s.first ? bv.next_step(m - 1) : -1;  // issued at the loop's start
  for (int c = m - 1; c >= s.first; --c) {
    out.push_back(logits(q, bv.far(c) ? kfar[at(c)] : s.khat[at(c)], D));
    if (bv.steps_after(c)) {
      EXPECT_EQ(slot, c) << "the E slot holds another chunk's step: m " << m << " c " << c << " block " << block;
      step(q, bv.far(c) ? fstep[at(bv.block_start(c))] : s.e[at(c)], D, true);
      slot = bv.next_step(c - 1);
    }
  }
  EXPECT_EQ(slot, -1) << "a step tile issued and never used: m " << m << " block " << block;
  return out;
}

TEST(CudaFwdBlocks, TwoLevelLogitsEqualPerChunk) {
  const int D = 8;
  // 11 chunks, the last 20 rows short; the sequence's chunks start at global index 5 (varlen's offsets).
  const Sequence s = make_sequence(5, 11, 20, D, 7);
  for (Form form : {Form::sweep, Form::items})
    for (int block : {1, 2, 3, 4, 5, 10, 11, 16})
      for (int m = s.first; m <= s.last; ++m) {
        const std::vector<Mat> want = pair_logits(s, m, 0), got = pair_logits(s, m, block, form);
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < want.size(); ++i)
          for (std::size_t r = 0; r < want[i].size(); ++r)
            ASSERT_NEAR(got[i][r], want[i][r], 1e-9 * (1 + std::abs(want[i][r])))
                << (form == Form::sweep ? "sweep" : "items") << " block " << block << " query chunk " << m
                << " key chunk " << m - 1 - int(i) << " element " << r;
      }
}

TEST(CudaFwdBlocks, SkippedItemsAreTheOnesNothingReads) {
  // 7 chunks from global index 3, blocks of 3: [3 4 5] [6 7 8] [9]. K' only outside the last block; F only for the
  // middle block (the first is never stepped over, the last has nothing after it).
  for (int c = 3; c <= 9; ++c) EXPECT_EQ(key_carry_item(c, 3, 9, 3).skip, c == 9) << c;
  EXPECT_EQ(key_carry_item(4, 3, 9, 3).steps(), 1);  // E_5
  EXPECT_EQ(key_carry_item(5, 3, 9, 3).steps(), 0);  // its block's last chunk: K' = K^
  EXPECT_TRUE(block_step_item(3, 3, 9, 3).skip);
  EXPECT_FALSE(block_step_item(6, 3, 9, 3).skip);
  EXPECT_EQ(block_step_item(6, 3, 9, 3).steps(), 3);  // E_8, E_7, E_6
  EXPECT_EQ(block_step_item(6, 3, 9, 3).j0, 8);
  EXPECT_TRUE(block_step_item(9, 3, 9, 3).skip);
  // The sweep: one item per block; F only for the middle block, and only there does X step after the first chunk.
  EXPECT_FALSE(block_sweep_item(3, 3, 9, 3).skip);
  EXPECT_FALSE(block_sweep_item(3, 3, 9, 3).need_f);
  EXPECT_FALSE(block_sweep_item(3, 3, 9, 3).steps_after(3));
  EXPECT_TRUE(block_sweep_item(3, 3, 9, 3).steps_after(4));
  EXPECT_TRUE(block_sweep_item(6, 3, 9, 3).need_f && block_sweep_item(6, 3, 9, 3).steps_after(6));
  EXPECT_EQ(block_sweep_item(6, 3, 9, 3).e, 8);
  EXPECT_TRUE(block_sweep_item(9, 3, 9, 3).skip);
  // Off: every chunk near, a step after each but the sequence's first.
  const FwdBlockView off = FwdBlockView::of(3, 9, 0);
  for (int c = 3; c < 9; ++c) {
    EXPECT_FALSE(off.far(c));
    EXPECT_EQ(off.steps_after(c), c > 3);
    EXPECT_EQ(off.next_step(c), c > 3 ? c : -1);
  }
}

}  // namespace
}  // namespace pathattn::cuda
