// Sequences of chunk factors for the host checks of the two-level schedules (test_cuda_fwd_blocks.cpp,
// test_cuda_bwd_blocks.cpp): K^, Q^ and E = -U^T W per chunk from the CPU core's chunk factors (src/cpu/chunk.h), in
// f64, and the row-major products the kernels' steps do.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "cpu/chunk.h"

namespace pathattn::cuda::block_test {

constexpr int C = static_cast<int>(cpu::kChunk);
using Mat = std::vector<double>;  // row-major

// X [rows, D] <- X + X A (transpose: X + X A^T), A [D, D].
inline void step(Mat& x, const Mat& a, int D, bool transpose) {
  const int rows = static_cast<int>(x.size()) / D;
  Mat y = x;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < D; ++j) {
      double acc = 0;
      for (int k = 0; k < D; ++k) acc += x[r * D + k] * (transpose ? a[j * D + k] : a[k * D + j]);
      y[r * D + j] += acc;
    }
  x = y;
}

// S [rows, C] = Q K^T.
inline Mat logits(const Mat& q, const Mat& k, int D) {
  const int rows = static_cast<int>(q.size()) / D, cols = static_cast<int>(k.size()) / D;
  Mat s(rows * cols, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      for (int d = 0; d < D; ++d) s[r * cols + c] += q[r * D + d] * k[c * D + d];
  return s;
}

struct Sequence {
  int first, last, D, heads;
  std::vector<Mat> khat, qhat, e;  // K^ [C, D] and E = -U^T W [D, D] per chunk; Q^ [C, D] per (chunk, query head):
                                   // qhat[chunk * heads + head]
};

// A sequence of `chunks` chunks (the last one `tail` rows short) with global chunk indices first.., from random
// w (unit rows), k, q and beta in (0, 2) through the CPU core's chunk factors; `heads` query heads share the chunk's
// keys and factors (GQA).
inline Sequence make_sequence(int first, int chunks, int tail, int D, unsigned seed, int heads = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.05f, 1.95f);
  Sequence s{first, first + chunks - 1, D, heads, {}, {}, {}};
  for (int j = 0; j < chunks; ++j) {
    const int n = j + 1 == chunks ? C - tail : C;
    std::vector<float> w(n * D), k(n * D), q(n * D), beta(n);
    for (int r = 0; r < n; ++r) {
      double norm = 0;
      for (int d = 0; d < D; ++d) norm += std::pow(w[r * D + d] = nd(rng), 2);
      for (int d = 0; d < D; ++d) w[r * D + d] /= static_cast<float>(std::sqrt(norm));
      for (int d = 0; d < D; ++d) k[r * D + d] = nd(rng), q[r * D + d] = nd(rng);
      beta[r] = ud(rng);
    }
    std::vector<float> T(n * n), U(n * D), Kcorr(n * n), Khat(n * D), QWl(n * n), Qhat(n * D), S(n * n);
    const cpu::ChunkFactors f{n, D, w.data(), k.data(), beta.data(), T.data(), U.data(), Kcorr.data(), Khat.data()};
    cpu::chunk_key_side(f);
    cpu::chunk_query_side(f, q.data(), QWl.data(), Qhat.data(), S.data());
    Mat e(D * D, 0.0), kh(C * D, 0.0), qh(C * D, 0.0);  // rows past a short chunk's end are zero, as on the GPU
    for (int a = 0; a < D; ++a)
      for (int b = 0; b < D; ++b)
        for (int r = 0; r < n; ++r) e[a * D + b] -= double(U[r * D + a]) * w[r * D + b];
    for (int i = 0; i < n * D; ++i) kh[i] = Khat[i], qh[i] = Qhat[i];
    s.khat.push_back(kh);
    s.qhat.push_back(qh);
    s.e.push_back(e);
    for (int hq = 1; hq < heads; ++hq) {  // the group's other query heads
      for (int i = 0; i < n * D; ++i) q[i] = nd(rng);
      cpu::chunk_query_side(f, q.data(), QWl.data(), Qhat.data(), S.data());
      Mat qo(C * D, 0.0);
      for (int i = 0; i < n * D; ++i) qo[i] = Qhat[i];
      s.qhat.push_back(qo);
    }
  }
  return s;
}

// Transposes X [D, D] and subtracts I: a block step F from X = Pi.
inline Mat block_step_from(const Mat& x, int D) {
  Mat f(D * D);
  for (int a = 0; a < D; ++a)
    for (int b = 0; b < D; ++b) f[a * D + b] = x[b * D + a] - (a == b ? 1 : 0);
  return f;
}

inline Mat identity(int D) {
  Mat x(D * D, 0.0);
  for (int d = 0; d < D; ++d) x[d * D + d] = 1;
  return x;
}

}  // namespace pathattn::cuda::block_test
