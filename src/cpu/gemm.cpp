#include "cpu/gemm.h"

#ifdef PATHATTN_WITH_BLAS
#include <cblas.h>
#endif

namespace pathattn::cpu {
namespace {

#ifdef PATHATTN_WITH_BLAS
void blas(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
void blas(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B, int ldb,
          double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
#endif

template <typename S>
void gemm_any(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, S alpha, const S* A, int64_t lda,
              const S* B, int64_t ldb, S beta, S* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef PATHATTN_WITH_BLAS
  if (K > 0) {
    blas(trans_a, trans_b, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
         static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
    return;
  }
#endif
  for (int64_t i = 0; i < M; ++i) {
    S* c = C + i * ldc;
    for (int64_t j = 0; j < N; ++j) c[j] = beta == S(0) ? S(0) : beta * c[j];
    for (int64_t p = 0; p < K; ++p) {
      const S a = alpha * (trans_a ? A[p * lda + i] : A[i * lda + p]);
      if (!trans_b) {
        const S* b = B + p * ldb;
        for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
      } else {
        for (int64_t j = 0; j < N; ++j) c[j] += a * B[j * ldb + p];
      }
    }
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_any(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  gemm_any(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace pathattn::cpu
