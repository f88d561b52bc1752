// The host-side plan of the CUDA decode (src/cuda/plan.cu): how many splits along the cache a step gets. Pure host
// arithmetic, so it runs without a GPU (label cpu). The numbers are the settings measured on the H200 (132 SMs,
// docs/perf/results.md, twelfth session): one wave of splits for few (sequence, kv head) pairs, four waves else.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace pathattn::cuda
