#include "cpu/block_carry.h"

#include <algorithm>
#include <vector>

#include "cpu/gemm.h"

namespace pathattn::cpu {
namespace {

// M [D, D] <- P_j M = M - W_j^T (U_j M); tmp holds n x D floats.
void left_times_p(const ChunkFactors& f, int64_t D, float* M, float* tmp) {
  gemm(false, false, f.n, D, D, 1.f, f.U, D, M, D, 0.f, tmp, D);
  gemm(true, false, D, D, f.n, -1.f, f.w, D, tmp, D, 1.f, M, D);
}

// X [rows, D] <- X P_j = X - (X W_j^T) U_j; tmp holds rows x n floats.
void right_times_p(const ChunkFactors& f, int64_t rows, int64_t D, float* X, float* tmp) {
  gemm(false, true, rows, f.n, D, 1.f, X, D, f.w, D, 0.f, tmp, f.n);
  gemm(false, false, rows, D, f.n, -1.f, tmp, f.n, f.U, D, 1.f, X, D);
}

}  // namespace

void block_product(const ChunkFactors* f, int64_t count, int64_t D, float* Pi) {
  std::fill(Pi, Pi + D * D, 0.f);
  for (int64_t d = 0; d < D; ++d) Pi[d * D + d] = 1.f;
  std::vector<float> tmp(kChunk * D);
  for (int64_t j = 0; j < count; ++j) left_times_p(f[j], D, Pi, tmp.data());
}

void block_product_backward(const ChunkFactors* f, int64_t count, int64_t D, const float* dPi, float* dW, float* dU) {
  // R[j] = P_{j-1} ... P_0 (R[0] = I), left to right; then the chunks from the last, with L = P_e ... P_{j+1}.
  std::vector<float> R(count * D * D, 0.f), L(D * D, 0.f), M(D * D), dP(D * D), tmp(std::max<int64_t>(D, kChunk) * D);
  for (int64_t d = 0; d < D; ++d) R[d * D + d] = L[d * D + d] = 1.f;
  for (int64_t j = 0; j + 1 < count; ++j) {  // R[j+1] = P_j R[j]
    std::copy(&R[j * D * D], &R[(j + 1) * D * D], &R[(j + 1) * D * D]);
    left_times_p(f[j], D, &R[(j + 1) * D * D], tmp.data());
  }
  for (int64_t j = count - 1; j >= 0; --j) {
    const int64_t n = f[j].n;
    gemm(true, false, D, D, D, 1.f, L.data(), D, dPi, D, 0.f, M.data(), D);             // L^T dPi
    gemm(false, true, D, D, D, 1.f, M.data(), D, &R[j * D * D], D, 0.f, dP.data(), D);  // dP_j = L^T dPi R^T
    float* dWj = dW + j * kChunk * D;
    float* dUj = dU + j * kChunk * D;
    gemm(false, true, n, D, D, -1.f, f[j].U, D, dP.data(), D, 1.f, dWj, D);   // dW_j -= U_j dP_j^T
    gemm(false, false, n, D, D, -1.f, f[j].w, D, dP.data(), D, 1.f, dUj, D);  // dU_j -= W_j dP_j
    right_times_p(f[j], D, D, L.data(), tmp.data());  // L <- L P_j
  }
}

void carry_query_to_block_start(const ChunkFactors* f, int64_t count, const float* Qhat, int64_t n, int64_t D,
                                float* Qp) {
  std::copy(Qhat, Qhat + n * D, Qp);
  std::vector<float> tmp(n * kChunk);
  for (int64_t j = count - 1; j >= 0; --j) right_times_p(f[j], n, D, Qp, tmp.data());  // Qp <- Qp P_j (Eq. 16)
}

void carry_query_to_block_start_backward(const ChunkFactors* f, int64_t count, const float* Qhat, const float* dQp,
                                         int64_t n, int64_t D, float* dQhat, float* dW, float* dU) {
  // X[t]: the rows before the step through chunk j = count-1-t (X[0] = Qhat).
  std::vector<float> X((count + 1) * n * D), A(n * kChunk), dA(n * kChunk), dY(dQp, dQp + n * D);
  std::copy(Qhat, Qhat + n * D, X.data());
  for (int64_t t = 0; t < count; ++t) {
    std::copy(&X[t * n * D], &X[(t + 1) * n * D], &X[(t + 1) * n * D]);
    right_times_p(f[count - 1 - t], n, D, &X[(t + 1) * n * D], A.data());
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
