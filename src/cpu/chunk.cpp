#include "cpu/chunk.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/gemm.h"

namespace pathattn::cpu {
namespace {

// Zeroes the part of an [n, n] matrix above the diagonal (strict: the diagonal too).
void mask_lower(float* X, int64_t n, bool strict) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = strict ? i : i + 1; j < n; ++j) X[i * n + j] = 0.f;
}

}  // namespace

void chunk_key_side(const ChunkFactors& f) {
  // In f64, stored as f32: the triangular solve and the products after it cancel when the directions are near
  // parallel and beta near 2, and their f32 rounding reached every gradient (see chunk_key_side_backward). O(C^2 D)
  // per chunk.
  const int64_t n = f.n, D = f.D;
  const std::vector<double> w(f.w, f.w + n * D), k(f.k, f.k + n * D), beta(f.beta, f.beta + n);
  // A = strict_lower(b W W^T), then T = (I + A)^{-1} by forward substitution: T_i = e_i - sum_{a<i} A_ia T_a.
  std::vector<double> A(n * n), T(n * n, 0.0);
  gemm(false, true, n, n, D, 1.0, w.data(), D, w.data(), D, 0.0, A.data(), n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) A[i * n + j] = j < i ? beta[i] * A[i * n + j] : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double* Ti = &T[i * n];
    Ti[i] = 1.0;
    for (int64_t a = 0; a < i; ++a) {
      const double c = A[i * n + a];
      if (c == 0.0) continue;
      const double* Ta = &T[a * n];
      for (int64_t j = 0; j <= a; ++j) Ti[j] -= c * Ta[j];
    }
  }
  // U = T b W (Eq. 10).
  std::vector<double> bW(n * D), U(n * D);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) bW[i * D + d] = beta[i] * w[i * D + d];
  gemm(false, false, n, D, n, 1.0, T.data(), n, bW.data(), D, 0.0, U.data(), D);
  // Kcorr = T Y with Y = b strict_lower(W K^T) (Eq. 12, 14).
  std::vector<double> Y(n * n), Kc(n * n);
  gemm(false, true, n, n, D, 1.0, w.data(), D, k.data(), D, 0.0, Y.data(), n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) Y[i * n + j] = j < i ? beta[i] * Y[i * n + j] : 0.0;
  gemm(false, false, n, n, n, 1.0, T.data(), n, Y.data(), n, 0.0, Kc.data(), n);
  // Khat = K - Kcorr^T W (Eq. 14).
  std::vector<double> Kh = k;
  gemm(true, false, n, D, n, -1.0, Kc.data(), n, w.data(), D, 1.0, Kh.data(), D);
  for (int64_t i = 0; i < n * n; ++i) {
    f.T[i] = static_cast<float>(T[i]);
    f.Kcorr[i] = static_cast<float>(Kc[i]);
  }
  for (int64_t i = 0; i < n * D; ++i) {
    f.U[i] = static_cast<float>(U[i]);
    f.Khat[i] = static_cast<float>(Kh[i]);
  }
}

void chunk_query_side(const ChunkFactors& f, const float* q, float* QWl, float* Qhat, float* S) {
  const int64_t n = f.n, D = f.D;
  gemm(false, true, n, n, D, 1.f, q, D, f.w, D, 0.f, QWl, n);
  mask_lower(QWl, n, false);
  std::memcpy(Qhat, q, sizeof(float) * n * D);
  gemm(false, false, n, D, n, -1.f, QWl, n, f.U, D, 1.f, Qhat, D);  // Eq. 13
  gemm(false, true, n, n, D, 1.f, q, D, f.k, D, 0.f, S, n);
  mask_lower(S, n, false);
  gemm(false, false, n, n, n, -1.f, QWl, n, f.Kcorr, n, 1.f, S, n);  // Eq. 12
}

void chunk_query_side_backward(const ChunkFactors& f, const float* q, const float* QWl, const float* dQhat,
                               const float* dS, float* dq, float* dk, float* dw, float* dU, float* dKcorr) {
  const int64_t n = f.n, D = f.D;
  std::vector<float> dQWl(n * n);
  // Qhat = q - QWl U: dq += dQhat, dQWl = -dQhat U^T, dU -= QWl^T dQhat (Eq. 26).
  for (int64_t i = 0; i < n * D; ++i) dq[i] += dQhat[i];
  gemm(false, true, n, n, D, -1.f, dQhat, D, f.U, D, 0.f, dQWl.data(), n);
  gemm(true, false, n, D, n, -1.f, QWl, n, dQhat, D, 1.f, dU, D);
  // S = lower(q K^T) - QWl Kcorr: dq += dS K, dk += dS^T q, dQWl -= dS Kcorr^T, dKcorr -= QWl^T dS (Eq. 27).
  gemm(false, false, n, D, n, 1.f, dS, n, f.k, D, 1.f, dq, D);
  gemm(true, false, n, D, n, 1.f, dS, n, q, D, 1.f, dk, D);
  gemm(false, true, n, n, n, -1.f, dS, n, f.Kcorr, n, 1.f, dQWl.data(), n);
  gemm(true, false, n, n, n, -1.f, QWl, n, dS, n, 1.f, dKcorr, n);
  // QWl = lower(q W^T): dq += dQWl W, dw += dQWl^T q (Eq. 28).
  mask_lower(dQWl.data(), n, false);
  gemm(false, false, n, D, n, 1.f, dQWl.data(), n, f.w, D, 1.f, dq, D);
  gemm(true, false, n, D, n, 1.f, dQWl.data(), n, q, D, 1.f, dw, D);
}

void chunk_key_side_backward(const ChunkFactors& f, const float* dU, const float* dKcorr_in, const float* dKhat,
                             float* dk, float* dw, float* dbeta) {
  const int64_t n = f.n, D = f.D;
  std::vector<float> scratch(4 * n * n + n * D);
  float* dKcorr = scratch.data();        // [n, n]
  float* M = dKcorr + n * n;      // [n, n] W K^T, later W W^T
  float* dT = M + n * n;          // [n, n]
  float* dY = dT + n * n;         // [n, n]
  float* dbW = dY + n * n;        // [n, D]
  std::memcpy(dKcorr, dKcorr_in, sizeof(float) * n * n);
  // Khat = K - Kcorr^T W: dk += dKhat, dKcorr -= W dKhat^T, dw -= Kcorr dKhat (Eq. 29).
  for (int64_t i = 0; i < n * D; ++i) dk[i] += dKhat[i];
  gemm(false, true, n, n, D, -1.f, f.w, D, dKhat, D, 1.f, dKcorr, n);
  gemm(false, false, n, D, n, -1.f, f.Kcorr, n, dKhat, D, 1.f, dw, D);
  // Kcorr = T Y, Y = b strict_lower(M), M = W K^T: dT = dKcorr Y^T, dY = T^T dKcorr.
  gemm(false, true, n, n, D, 1.f, f.w, D, f.k, D, 0.f, M, n);
  std::vector<float> Y(n * n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) Y[i * n + j] = j < i ? f.beta[i] * M[i * n + j] : 0.f;
  gemm(false, true, n, n, n, 1.f, dKcorr, n, Y.data(), n, 0.f, dT, n);
  gemm(true, false, n, n, n, 1.f, f.T, n, dKcorr, n, 0.f, dY, n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      if (j < i) {
        dbeta[i] += dY[i * n + j] * M[i * n + j];
        dY[i * n + j] *= f.beta[i];  // now d loss / d M (strict lower part)
      } else {
        dY[i * n + j] = 0.f;
      }
    }
  gemm(false, false, n, D, n, 1.f, dY, n, f.k, D, 1.f, dw, D);
  gemm(true, false, n, D, n, 1.f, dY, n, f.w, D, 1.f, dk, D);
  // U = T (b W): dT += dU (b W)^T, d(bW) = T^T dU.
  std::vector<float> bW(n * D);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) bW[i * D + d] = f.beta[i] * f.w[i * D + d];
  gemm(false, true, n, n, D, 1.f, dU, D, bW.data(), D, 1.f, dT, n);
  gemm(true, false, n, D, n, 1.f, f.T, n, dU, D, 0.f, dbW, D);
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0.f;
    for (int64_t d = 0; d < D; ++d) {
      acc += dbW[i * D + d] * f.w[i * D + d];
      dw[i * D + d] += f.beta[i] * dbW[i * D + d];
    }
    dbeta[i] += acc;
  }
  // T = (I + A)^{-1}: dA = -T^T dT T^T, strictly lower (Eq. 30). Reuse dY for T^T dT, M for W W^T.
  gemm(true, false, n, n, n, 1.f, f.T, n, dT, n, 0.f, dY, n);
  gemm(false, true, n, n, n, -1.f, dY, n, f.T, n, 0.f, dT, n);  // dT now holds dA
  gemm(false, true, n, n, D, 1.f, f.w, D, f.w, D, 0.f, M, n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      if (j < i) {
        dbeta[i] += dT[i * n + j] * M[i * n + j];
        dT[i * n + j] *= f.beta[i];  // d loss / d (W W^T), strict lower part
      } else {
        dT[i * n + j] = 0.f;
      }
    }
  // A = b strict_lower(W W^T): dW += (dN + dN^T) W.
  gemm(false, false, n, D, n, 1.f, dT, n, f.w, D, 1.f, dw, D);
  gemm(true, false, n, D, n, 1.f, dT, n, f.w, D, 1.f, dw, D);
}

}  // namespace pathattn::cpu
