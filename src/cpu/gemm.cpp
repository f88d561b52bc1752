#include "cpu/gemm.h"

#ifdef PATHATTN_WITH_BLAS
#include <cblas.h>
#endif

namespace pathattn::cpu {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef PATHATTN_WITH_BLAS
  if (K > 0) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
                static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
    return;
  }
#endif
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    for (int64_t j = 0; j < N; ++j) c[j] = beta == 0.f ? 0.f : beta * c[j];
    for (int64_t p = 0; p < K; ++p) {
      const float a = alpha * (trans_a ? A[p * lda + i] : A[i * lda + p]);
      if (!trans_b) {
        const float* b = B + p * ldb;
        for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
      } else {
        for (int64_t j = 0; j < N; ++j) c[j] += a * B[j * ldb + p];
      }
    }
  }
}

}  // namespace pathattn::cpu
