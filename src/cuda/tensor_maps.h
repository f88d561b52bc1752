// Host side of the bulk copy engine: tensor maps (CUtensorMap) for the tiles the wgmma kernels stream and reduce into.
// cuTensorMapEncodeTiled is a driver function; it is fetched once through the runtime's entry-point query, so the
// library links only cudart.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace pathattn::cuda {

// A row-major [rows, cols] 16-bit matrix with row stride `row_stride` elements, read as box_rows x box_cols tiles,
// written to shared memory in the 128-byte swizzle (box_cols * 2 bytes must be at most 128). Throws
// pathattn::Error if the driver refuses the map.
CUtensorMap tensor_map_2d(const void* base, int64_t rows, int64_t cols, int64_t row_stride, int box_rows, int box_cols,
                          const char* what);

// A dense row-major [rows, cols] f32 matrix, as box_rows x box_cols tiles in the 128-byte swizzle (box_cols * 4 bytes
// at most 128): the target of bulk reductions (kernels/tma.cuh tma_reduce_add_2d).
CUtensorMap tensor_map_2d_f32(float* base, int64_t rows, int64_t cols, int box_rows, int box_cols, const char* what);

// The two-level carry's maps (forward and backward: K', Q', the block steps F): `base` as a [rows, D] matrix in
// 64 x 64 boxes when blocks are on, else `off`, the map of the per-chunk buffer it stands in for (the kernels never
// read a far map without blocks, but take one).
CUtensorMap far_map(bool on, const void* base, int64_t rows, int64_t D, const CUtensorMap& off, const char* what);

// A [B, T, H, D] 16-bit tensor with element strides (b, t, h), read as box_t (t) x box_d (d) tiles at (b, t0, h);
// rows past T read as zeros.
CUtensorMap tensor_map_bthd(const void* base, int64_t B, int64_t T, int64_t H, int64_t D, int64_t sb, int64_t st,
                            int64_t sh, int box_t, int box_d, const char* what);

}  // namespace pathattn::cuda
