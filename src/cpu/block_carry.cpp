#include "cpu/block_carry.h"

#include <algorithm>
#include <vector>

#include "cpu/gemm.h"

namespace pathattn::cpu {

void block_product(const ChunkFactors* f, int64_t count, int64_t D, float* Pi) {
  std::fill(Pi, Pi + D * D, 0.f);
  for (int64_t d = 0; d < D; ++d) Pi[d * D + d] = 1.f;
  std::vector<float> UPi(kChunk * D);
  for (int64_t j = 0; j < count; ++j) {  // Pi <- P_j Pi = Pi - W_j^T (U_j Pi)
    const int64_t n = f[j].n;
    gemm(false, false, n, D, D, 1.f, f[j].U, D, Pi, D, 0.f, UPi.data(), D);
    gemm(true, false, D, D, n, -1.f, f[j].w, D, UPi.data(), D, 1.f, Pi, D);
  }
}

void block_product_backward(const ChunkFactors* f, int64_t count, int64_t D, const float* dPi, float* dW, float* dU) {
  // R[j] = P_{j-1} ... P_0 (R[0] = I), left to right; then the chunks from the last, with L = P_e ... P_{j+1}.
  std::vector<float> R(count * D * D, 0.f), L(D * D, 0.f), M(D * D), dP(D * D), tmp(std::max<int64_t>(D, kChunk) * D);
  for (int64_t d = 0; d < D; ++d) R[d * D + d] = L[d * D + d] = 1.f;
  for (int64_t j = 0; j + 1 < count; ++j) {  // R[j+1] = P_j R[j] = R[j] - W_j^T (U_j R[j])
    float* next = &R[(j + 1) * D * D];
    std::copy(&R[j * D * D], &R[(j + 1) * D * D], next);
    gemm(false, false, f[j].n, D, D, 1.f, f[j].U, D, &R[j * D * D], D, 0.f, tmp.data(), D);
    gemm(true, false, D, D, f[j].n, -1.f, f[j].w, D, tmp.data(), D, 1.f, next, D);
  }
  for (int64_t j = count - 1; j >= 0; --j) {
    const int64_t n = f[j].n;
    gemm(true, false, D, D, D, 1.f, L.data(), D, dPi, D, 0.f, M.data(), D);             // L^T dPi
    gemm(false, true, D, D, D, 1.f, M.data(), D, &R[j * D * D], D, 0.f, dP.data(), D);  // dP_j = L^T dPi R^T
    float* dWj = dW + j * kChunk * D;
    float* dUj = dU + j * kChunk * D;
    gemm(false, true, n, D, D, -1.f, f[j].U, D, dP.data(), D, 1.f, dWj, D);   // dW_j -= U_j dP_j^T
    gemm(false, false, n, D, D, -1.f, f[j].w, D, dP.data(), D, 1.f, dUj, D);  // dU_j -= W_j dP_j
    // L <- L P_j = L - (L W_j^T) U_j
    gemm(false, true, D, n, D, 1.f, L.data(), D, f[j].w, D, 0.f, tmp.data(), n);
    gemm(false, false, D, D, n, -1.f, tmp.data(), n, f[j].U, D, 1.f, L.data(), D);
  }
}

void carry_query_to_block_start(const ChunkFactors* f, int64_t count, const float* Qhat, int64_t n, int64_t D,
                                float* Qp) {
  std::copy(Qhat, Qhat + n * D, Qp);
  std::vector<float> A(n * kChunk);
  for (int64_t j = count - 1; j >= 0; --j) {  // Qp <- Qp P_j = Qp - (Qp W_j^T) U_j (Eq. 16)
    gemm(false, true, n, f[j].n, D, 1.f, Qp, D, f[j].w, D, 0.f, A.data(), f[j].n);
    gemm(false, false, n, D, f[j].n, -1.f, A.data(), f[j].n, f[j].U, D, 1.f, Qp, D);
  }
}

void carry_query_to_block_start_backward(const ChunkFactors* f, int64_t count, const float* Qhat, const float* dQp,
                                         int64_t n, int64_t D, float* dQhat, float* dW, float* dU) {
  // X[t]: the rows before the step through chunk j = count-1-t (X[0] = Qhat).
  std::vector<float> X((count + 1) * n * D), A(n * kChunk), dA(n * kChunk), dY(dQp, dQp + n * D);
  std::copy(Qhat, Qhat + n * D, X.data());
  for (int64_t t = 0; t < count; ++t) {
    const ChunkFactors& c = f[count - 1 - t];
    float* next = &X[(t + 1) * n * D];
    std::copy(&X[t * n * D], &X[(t + 1) * n * D], next);
    gemm(false, true, n, c.n, D, 1.f, &X[t * n * D], D, c.w, D, 0.f, A.data(), c.n);
    gemm(false, false, n, D, c.n, -1.f, A.data(), c.n, c.U, D, 1.f, next, D);
  }
  for (int64_t t = count - 1; t >= 0; --t) {  // Y = X - A U_j, A = X W_j^T
    const int64_t j = count - 1 - t;
    const ChunkFactors& c = f[j];
    const float* Xt = &X[t * n * D];
    float* dWj = dW + j * kChunk * D;
    float* dUj = dU + j * kChunk * D;
    gemm(false, true, n, c.n, D, -1.f, dY.data(), D, c.U, D, 0.f, dA.data(), c.n);   // dA = -dY U_j^T
    gemm(false, true, n, c.n, D, 1.f, Xt, D, c.w, D, 0.f, A.data(), c.n);            // A = X W_j^T
    gemm(true, false, c.n, D, n, -1.f, A.data(), c.n, dY.data(), D, 1.f, dUj, D);    // dU_j -= A^T dY
    gemm(true, false, c.n, D, n, 1.f, dA.data(), c.n, Xt, D, 1.f, dWj, D);           // dW_j += dA^T X
    gemm(false, false, n, D, c.n, 1.f, dA.data(), c.n, c.w, D, 1.f, dY.data(), D);   // dX = dY + dA W_j
  }
  for (int64_t i = 0; i < n * D; ++i) dQhat[i] += dY[i];
}

}  // namespace pathattn::cpu
