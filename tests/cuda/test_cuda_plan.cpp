// The host-side plans of the CUDA kernels (src/cuda/plan.cu): how many splits along the cache a decode step gets,
// and the backward main kernel's task list. Pure host arithmetic, so it runs without a GPU (label cpu). The decode
// numbers are the settings measured on the H200 (132 SMs, docs/perf/results.md, twelfth session): one wave of
// splits for few (sequence, kv head) pairs, four waves else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "cuda/bwd_blocks.h"
#include "cuda/plan.h"

namespace pathattn::cuda {
namespace {

constexpr int kH200Sms = 132;

TEST(CudaPlan, DecodeSplitsOneWaveForFewPairs) {
  // B = 1, H = 8: 8 pairs <= 132 / 8, so one full wave of 2 x 132 blocks: 264 / 8 = 33 splits per pair, capped by
  // the 128-row minimum at short caches (4096 / 128 = 32).
  EXPECT_EQ(decode_splits(1, 8, 4096, kH200Sms), 32);
  EXPECT_EQ(decode_splits(1, 8, 16384, kH200Sms), 33);
  EXPECT_EQ(decode_splits(1, 8, 131072, kH200Sms), 33);
  // B = 2, H = 8: 16 pairs, still one wave, rounded down so that no block waits for a second one (264 / 16 = 16.5).
  EXPECT_EQ(decode_splits(2, 8, 16384, kH200Sms), 16);
  // Few rows: never a split of under 128 rows, never fewer than one split.
  EXPECT_EQ(decode_splits(1, 8, 1000, kH200Sms), 7);
  EXPECT_EQ(decode_splits(1, 8, 5, kH200Sms), 1);
}

TEST(CudaPlan, DecodeSplitsOneWaveCountsTheKernelsResidentBlocks) {
  // The tensor-core kernel at D = 128 holds one block per SM: its one wave is 132 blocks, not 264 (which made two).
  EXPECT_EQ(decode_splits(1, 8, 16384, kH200Sms, 1), 16);
  EXPECT_EQ(decode_splits(1, 8, 131072, kH200Sms, 1), 16);
  EXPECT_EQ(decode_splits(2, 8, 16384, kH200Sms, 1), 8);
  // Four waves stay counted at two blocks per SM, as measured (B = 8: 16 splits either way).
  EXPECT_EQ(decode_splits(8, 8, 16384, kH200Sms, 1), 16);
  EXPECT_EQ(decode_splits(8, 8, 16384, kH200Sms, 2), decode_splits(8, 8, 16384, kH200Sms));
}

TEST(CudaPlan, DecodeSplitsFourWavesForManyPairs) {
  // B = 8, H = 8: 64 pairs > 132 / 8: about four waves (one wave was 6-30% slower there). 4 x 264 / 64 = 16.5:
  // 16 splits make 1024 blocks, 3.88 waves (4 block times of L / 16 rows: cost 0.25 L); 17 make 1088, 4.12 waves
  // (5 block times of L / 17: 0.29 L), so 16.
  EXPECT_EQ(decode_splits(8, 8, 16384, kH200Sms), 16);
  // B = 16: 8.25 -> 8 splits (1024 blocks, 4 waves: cost 4 / 8) beats 9 (1152 blocks, 5 waves: 5 / 9).
  EXPECT_EQ(decode_splits(16, 8, 16384, kH200Sms), 8);
  // B = 3, H = 8: 24 pairs, just above the one-wave bound: 1056 / 24 = 44 exactly.
  EXPECT_EQ(decode_splits(3, 8, 16384, kH200Sms), 44);
  // B = 64: 2.06: 2 splits (1024 blocks, 4 waves: 4 / 2) and 3 (1536, 6 waves: 6 / 3) cost the same: the larger.
  EXPECT_EQ(decode_splits(64, 8, 131072, kH200Sms), 3);
  // B = 32: 4.125: 4 (1024 blocks, 4 waves) and 5 (1280, 5 waves) tie too: 5.
  EXPECT_EQ(decode_splits(32, 8, 131072, kH200Sms), 5);
}

// The backward's task list with key blocks of 1 and 2 chunks (the two-chunk main kernel, bwd_main_pair.cuh): every
// chunk of every (sequence, head) is covered by exactly one task, a block starts at its sequence's first chunk or
// an even number of chunks after it, and within a (sequence, head) the blocks come from the last to the first, so
// that the deterministic turns (block c0 adds after the blocks above it) only wait for tasks taken earlier.
TEST(CudaPlan, ForwardBlocksRestartAtEverySequence) {
  // Chunks per sequence: 1, 1, 2, 5, 3 (the backward test's segments). Blocks of 2: [0] [1] [2 3] [4 5] [6 7] [8]
  // [9 10] [11]; blocks of 1: every chunk its own; 0: no tables.
  const std::vector<Segment> segs = {{0, 0, 1}, {0, 1, 64}, {0, 65, 65}, {0, 130, 300}, {0, 430, 192}};
  Plan pl = make_plan(segs, 2, false);
  ASSERT_EQ(pl.chunks.size(), 12u);
  add_carry_blocks(pl, 2);
  EXPECT_EQ(pl.carry_block, 2);
  EXPECT_EQ(pl.blk_start, (std::vector<int>{0, 1, 2, 4, 6, 8, 9, 11}));
  EXPECT_EQ(pl.blk_of, (std::vector<int>{0, 1, 2, 2, 3, 3, 4, 4, 5, 6, 6, 7}));
  add_carry_blocks(pl, 1);
  EXPECT_EQ(pl.blk_start.size(), 12u);
  for (int c = 0; c < 12; ++c) EXPECT_EQ(pl.blk_of[c], c);
  add_carry_blocks(pl, 0);
  EXPECT_EQ(pl.carry_block, 0);
  EXPECT_TRUE(pl.blk_of.empty() && pl.blk_start.empty());
  // Every chunk's block starts at its sequence's first chunk plus a multiple of the block size (the kernels'
  // block_start arithmetic, fwd_wgmma.cuh and fwd_block_carry.cuh, agrees with the table).
  for (int block : {1, 2, 3, 7}) {
    add_carry_blocks(pl, block);
    for (int c = 0; c < 12; ++c) {
      const ChunkInfo& ci = pl.chunks[c];
      EXPECT_EQ(pl.blk_start[pl.blk_of[c]], ci.first + (c - ci.first) / block * block) << "chunk " << c << " block " << block;
    }
  }
}

TEST(CudaPlan, ForwardBlockByCount) {
  // cost(B) = group ((B - 1) / 2 + n / (2 B)) + 1 + D / 64, against group (n - 1) / 2 per chunk.
  EXPECT_EQ(fwd_block_by_count(64, 1, 128), 8);   // (B - 1) / 2 + 32 / B + 3: 10.5 at 8 (10.57 at 7, 10.56 at 9)
  EXPECT_EQ(fwd_block_by_count(256, 1, 64), 16);  // (B - 1) / 2 + 128 / B + 2: 17.5 at 16, 17.53 at 15 and 17
  EXPECT_EQ(fwd_block_by_count(64, 4, 64), 8);    // 4 ((B - 1) / 2 + 32 / B) + 2: 32 at 8, 32.29 at 7, 32.22 at 9
  EXPECT_EQ(fwd_block_by_count(16, 1, 64), 4);    // 5.5 at 4, under 0.75 x 7.5
  // Too few chunks: at 8, the best (4.33 at B = 3) is not even below the per-chunk 3.5; one chunk has no step at all.
  EXPECT_EQ(fwd_block_by_count(8, 1, 64), 0);
  EXPECT_EQ(fwd_block_by_count(1, 1, 64), 0);
  EXPECT_EQ(fwd_block_by_count(0, 1, 64), 0);
}

TEST(CudaPlan, ForwardBlockDefault) {
  EXPECT_EQ(fwd_block_default(64, 1, 128), 8);    // D = 128: by count
  EXPECT_EQ(fwd_block_default(256, 2, 128), 16);
  EXPECT_EQ(fwd_block_default(16, 1, 128), 0);    // the count's own cut
  EXPECT_EQ(fwd_block_default(64, 1, 64), 0);     // D = 64: off below 256 chunks (measured slower at 64)
  EXPECT_EQ(fwd_block_default(255, 1, 64), 0);
  EXPECT_EQ(fwd_block_default(256, 1, 64), 16);
}

TEST(CudaPlan, BackwardBlocksByDefaultFrom64ChunksByMode) {
  // PATHATTN_BWD_BLOCK unset (as in CI): off below 64 chunks; from 64 on, deterministic: 4 at D = 128 below 512
  // chunks, else 8; fast: 8 below 256 chunks, else 16 (plan.h bwd_block_default, measured). The two-chunk kernel
  // takes them as they are (even), and no setting needs the mma.sync kernel.
  if (std::getenv("PATHATTN_BWD_BLOCK") != nullptr) GTEST_SKIP() << "PATHATTN_BWD_BLOCK is set";
  EXPECT_EQ(bwd_block_setting(), kBwdBlockUnset);
  for (int kb : {1, 2})
    for (bool det : {true, false}) {
      EXPECT_EQ(bwd_block_for(16, 64, kb, det), 0);
      EXPECT_EQ(bwd_block_for(63, 128, kb, det), 0);
    }
  for (int kb : {1, 2}) {
    EXPECT_EQ(bwd_block_for(64, 64, kb, true), 8);
    EXPECT_EQ(bwd_block_for(1024, 64, kb, true), 8);
    EXPECT_EQ(bwd_block_for(64, 128, kb, true), 4);
    EXPECT_EQ(bwd_block_for(511, 128, kb, true), 4);
    EXPECT_EQ(bwd_block_for(512, 128, kb, true), 8);
    for (int D : {64, 128}) {
      EXPECT_EQ(bwd_block_for(64, D, kb, false), 8);
      EXPECT_EQ(bwd_block_for(255, D, kb, false), 8);
      EXPECT_EQ(bwd_block_for(256, D, kb, false), 16);
    }
  }
  EXPECT_FALSE(bwd_blocks_need_mma(64));
  EXPECT_FALSE(bwd_blocks_need_mma(128));
}

TEST(CudaPlan, SlotsHoldEveryTasksLevels) {
  // bwd_slot_chunks sizes the main kernel's slots: every key chunk's task stores one carried copy per level
  // (cuda/bwd_blocks.h), so no task may have more levels than the slot holds, and the bound is reached (no slack);
  // without blocks the slot holds max_chunks, as before the two-level backward.
  const std::vector<Segment> segs = {{0, 0, 1}, {0, 1, 64}, {0, 65, 65}, {0, 130, 300}, {0, 430, 16384}};
  Plan off = make_plan(segs, 2, true, 1, 1);
  EXPECT_EQ(bwd_slot_chunks(off), off.max_chunks);
  for (int block : {1, 2, 3, 8, 16, 300}) {
    Plan pl = make_plan(segs, 2, true, 1, 1);
    add_carry_blocks(pl, block);
    const int slots = bwd_slot_chunks(pl);
    int most = 0;
    for (const SeqInfo& s : pl.seqs)
      for (int c = s.first; c < s.first + s.count; ++c) {
        const int n = BwdLevels::of(c, s.first, s.first + s.count - 1, block).count();
        ASSERT_LE(n, slots) << "block " << block << ", chunk " << c;
        most = std::max(most, n);
      }
    EXPECT_EQ(slots, std::max(most, 1)) << "block " << block;
  }
  Plan eight = make_plan({{0, 0, 16384}}, 1, true, 1, 1);  // 256 chunks, blocks of 8: 7 near + 31 far levels
  add_carry_blocks(eight, 8);
  EXPECT_EQ(bwd_slot_chunks(eight), 7 + 31);
}

TEST(CudaPlan, BackwardTasksCoverEveryChunkOnceInBlocks) {
  const std::vector<Segment> segs = {{0, 0, 1}, {0, 1, 64}, {0, 65, 65}, {0, 130, 300}, {0, 430, 192}};
  const int H = 3;
  for (int kb : {1, 2})
    for (int group : {1, 3, 8}) {
      const Plan pl = make_plan(segs, H, true, group, kb);
      std::map<std::pair<int, int>, int> covered;          // (chunk, head) -> tasks covering it
      std::map<std::pair<int, int>, int> last_start;       // (sequence first chunk, head) -> the previous block's start
      for (int task : pl.bwd_tasks) {
        const int c0 = task / H, h = task % H;
        const ChunkInfo& ci = pl.chunks[c0];
        EXPECT_EQ((c0 - ci.first) % kb, 0) << "block start " << c0 << " kb " << kb;
        for (int c = c0; c < c0 + kb && c <= ci.last; ++c) ++covered[{c, h}];
        auto key = std::make_pair(ci.first, h);
        if (last_start.count(key)) EXPECT_LT(c0, last_start[key]) << "blocks of a pair from the last to the first";
        last_start[key] = c0;
      }
      EXPECT_EQ(covered.size(), pl.chunks.size() * H) << "kb " << kb << " group " << group;
      for (const auto& [chunk_head, n] : covered) EXPECT_EQ(n, 1) << "chunk " << chunk_head.first << " head " << chunk_head.second;
      std::size_t blocks = 0;
      for (const SeqInfo& s : pl.seqs) blocks += static_cast<std::size_t>((s.count + kb - 1) / kb) * H;
      EXPECT_EQ(pl.bwd_tasks.size(), blocks);
    }
}

}  // namespace
}  // namespace pathattn::cuda
