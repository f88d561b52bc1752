// The 128-byte swizzle of Hopper's copy engine (CU_TENSOR_MAP_SWIZZLE_128B) and of wgmma's shared-memory operands, as
// element indices: host and device, so that tests/cuda/test_cuda_swizzle.cpp checks the layout against the copy
// engine's definition on the host.
#pragma once

#include "cuda/host_device.h"

namespace pathattn::cuda {

// Element index of (row, col) in a tile stored as boxes of `rows` rows of 128 bytes (128 / kBytes elements each),
// box after box along the columns, every box 1024-byte aligned and in the 128-byte swizzle: the copy engine moves the
// 16-byte chunk j of row r to chunk j ^ (r % 8) (byte offset o -> o ^ ((o >> 7) & 7) << 4). kBytes = 2: the 64-column
// bf16 / f16 sub-tiles of the wgmma kernels; kBytes = 4: f32 tiles of 32-column boxes (the bulk reductions'
// staging, kernels/bwd_main_pair.cuh).
// (Shifts and masks, not / and %: the same instructions as the wgmma kernels' index had before it moved here.)
// swz128_in_box: the same for a column inside one box (col < 128 / kBytes), for callers whose box is known apart.
template <int kBytes>
PATHATTN_HD int swz128_in_box(int row, int col) {
  static_assert(kBytes == 2 || kBytes == 4, "16- or 32-bit elements");
  constexpr int kChunkShift = kBytes == 2 ? 3 : 2, kPerChunk = 1 << kChunkShift;  // elements per 16 bytes
  return row * (128 / kBytes) + (((col >> kChunkShift) ^ row) & 7) * kPerChunk + (col & (kPerChunk - 1));
}
template <int kBytes>
PATHATTN_HD int swz128(int row, int col, int rows) {
  constexpr int kRowShift = kBytes == 2 ? 6 : 5;  // log2 of the elements in 128 bytes
  return (col >> kRowShift) * (rows << kRowShift) + swz128_in_box<kBytes>(row, col & ((1 << kRowShift) - 1));
}

}  // namespace pathattn::cuda
