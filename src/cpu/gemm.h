// Row-major single-precision GEMM for the CPU path: C = alpha op(A) op(B) + beta C.
// OpenBLAS's cblas_sgemm when the build found it, else a plain cache-friendly loop (same results to rounding).
#pragma once

#include <cstdint>

namespace pathattn::cpu {

// op(A) is [M, K] (A stored [K, M] when trans_a), op(B) is [K, N] (B stored [N, K] when trans_b).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The same in double (cblas_dgemm): for the few chunk-local steps whose f32 rounding is amplified by cancellation.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

}  // namespace pathattn::cpu
