// Host side of the bulk copy engine: tensor maps (CUtensorMap) for the tiles the D = 64 forward kernel streams.
// cuTensorMapEncodeTiled is a driver function; it is fetched once through the runtime's entry-point query, so the
// library links only cudart.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace pathattn::cuda {

// A row-major [rows, 64] 16-bit matrix with row stride `row_stride` elements, read as 64 x 64 tiles,
// written to shared memory in the 128-byte swizzle. Throws pathattn::Error if the driver refuses the map.
CUtensorMap tensor_map_rows64(const void* base, int64_t rows, int64_t row_stride, const char* what);

// A [B, T, H, 64] 16-bit tensor with element strides (b, t, h), read as 64 (t) x 64 (d) tiles at (b, t0, h);
// rows past T read as zeros.
CUtensorMap tensor_map_bthd64(const void* base, int64_t B, int64_t T, int64_t H, int64_t sb, int64_t st, int64_t sh,
                              const char* what);

}  // namespace pathattn::cuda
