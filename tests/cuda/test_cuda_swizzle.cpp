// The 128-byte swizzle as the kernels index it (src/cuda/swizzle.h) against the copy engine's definition, on the host
// (label cpu): a tile of boxes, each 1024-byte aligned with rows of 128 bytes, where byte offset o of a box holds what
// the unswizzled box has at o ^ ((o >> 7) & 7) << 4. And the bulk turns' staging (kernels/bwd_main_pair.cuh
// stage_acc_swz): every float2 store of a warp meets each of the 32 banks exactly twice, the least for 256 bytes.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "cuda/swizzle.h"

namespace pathattn::cuda {
namespace {

// The copy engine's placement of element (row, col) of a [rows, 128 / bytes * boxes] tile, in elements.
int engine_index(int row, int col, int rows, int bytes) {
  const int per_row = 128 / bytes;
  const int box = col / per_row;
  const int o = row * 128 + (col % per_row) * bytes;  // byte offset inside the box, unswizzled
  return box * rows * per_row + (o ^ (((o >> 7) & 7) << 4)) / bytes;
}

TEST(CudaSwizzle, MatchesTheCopyEngineAndIsABijection) {
  for (int bytes : {2, 4}) {
    const int rows = 64, cols = 2 * 128 / bytes;  // two boxes
    std::set<int> seen;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const int i = bytes == 2 ? swz128<2>(r, c, rows) : swz128<4>(r, c, rows);
        ASSERT_EQ(i, engine_index(r, c, rows, bytes)) << "bytes " << bytes << " row " << r << " col " << c;
        ASSERT_GE(i, 0);
        ASSERT_LT(i, rows * cols);
        seen.insert(i);
      }
    EXPECT_EQ(static_cast<int>(seen.size()), rows * cols) << "bytes " << bytes;
  }
}

// stage_acc_swz: lane (g = lane / 4, t4 = lane % 4) of the warp owning rows row0.. stores its accumulator pair
// (row row0 + g + 8 hh, columns nt * 8 + 2 t4 and + 1) as one float2, for each (nt, hh). 32 lanes x 8 bytes: two
// wavefronts at best, i.e. every 4-byte bank hit exactly twice.
TEST(CudaSwizzle, TheBulkStagingStoresAreConflictFree) {
  for (int row0 = 0; row0 < 64; row0 += 16)
    for (int nt = 0; nt < 8; ++nt)
      for (int hh = 0; hh < 2; ++hh) {
        std::vector<int> hits(32, 0);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t4 = lane % 4;
          // (stage_acc_swz's own index: box nt / 4 of 64 x 32 floats, then the column inside it)
          const int i = (nt / 4) * (64 * 32) + swz128_in_box<4>(row0 + g + 8 * hh, (nt % 4) * 8 + 2 * t4);
          ASSERT_EQ(i, swz128<4>(row0 + g + 8 * hh, nt * 8 + 2 * t4, 64));
          ASSERT_EQ(i % 2, 0) << "a float2 store needs an 8-byte aligned element";
          ++hits[i % 32];
          ++hits[(i + 1) % 32];
        }
        for (int b = 0; b < 32; ++b) EXPECT_EQ(hits[b], 2) << "row0 " << row0 << " nt " << nt << " hh " << hh << " bank " << b;
      }
}

}  // namespace
}  // namespace pathattn::cuda
