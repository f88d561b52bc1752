#include "cuda/tensor_maps.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <string>

#include "cuda/check.h"
#include "pathattn/pathattn.h"

namespace pathattn::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || p == nullptr)
      throw RuntimeError("CUDA driver: cuTensorMapEncodeTiled is not available (driver older than CUDA 12?)");
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  return fn;
}

CUtensorMap encode(const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides_bytes,
                   const cuuint32_t* box, const char* what,
                   CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16) {
  CUtensorMap map;
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode_fn()(&map, type, rank, const_cast<void*>(base), dims,
                                 strides_bytes, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(std::string("cuTensorMapEncodeTiled failed for ") + what + " (CUresult " + std::to_string(r) +
                "): base must be 16-byte aligned and strides multiples of 16 bytes");
  return map;
}

}  // namespace

// The data type only sets the element size for the copy engine: bf16 and f16 tiles move alike.
CUtensorMap far_map(bool on, const void* base, int64_t rows, int64_t D, const CUtensorMap& off, const char* what) {
  return on ? tensor_map_2d(base, rows, D, D, 64, 64, what) : off;
}

CUtensorMap tensor_map_2d(const void* base, int64_t rows, int64_t cols, int64_t row_stride, int box_rows, int box_cols,
                          const char* what) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  return encode(base, 2, dims, strides, box, what);
}

CUtensorMap tensor_map_2d_f32(float* base, int64_t rows, int64_t cols, int box_rows, int box_cols, const char* what) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 4};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  return encode(base, 2, dims, strides, box, what, CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
}

CUtensorMap tensor_map_bthd(const void* base, int64_t B, int64_t T, int64_t H, int64_t D, int64_t sb, int64_t st,
                            int64_t sh, int box_t, int box_d, const char* what) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(T), static_cast<cuuint64_t>(H),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st) * 2, static_cast<cuuint64_t>(sh) * 2,
                                 static_cast<cuuint64_t>(sb) * 2};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_d), static_cast<cuuint32_t>(box_t), 1, 1};
  return encode(base, 4, dims, strides, box, what);
}

}  // namespace pathattn::cuda
