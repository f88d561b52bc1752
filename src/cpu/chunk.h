// One chunk's UT factors and chunk-local quantities (docs/math.md Eq. 10-14), and their backward
// (Eq. 24-30). Row-major float32 buffers; n <= C rows, D columns. All buffers are owned by the caller.
#pragma once

#include <cstdint>

namespace pathattn::cpu {

constexpr int64_t kChunk = 64;  // C: rows per chunk (a GEMM-friendly size; the UT solve is O(C^3) per chunk)

struct ChunkFactors {
  int64_t n = 0, D = 0;
  const float* w = nullptr;     // [n, D] directions
  const float* k = nullptr;     // [n, D] keys
  const float* beta = nullptr;  // [n]
  float* T = nullptr;           // [n, n] (I + strict_lower(b W W^T))^{-1}            Eq. 10
  float* U = nullptr;           // [n, D] T b W                                      Eq. 10
  float* Kcorr = nullptr;       // [n, n] T b strict_lower(W K^T)                    Eq. 12, 14
  float* Khat = nullptr;        // [n, D] keys carried to the chunk end: K - Kcorr^T W   Eq. 14
};

// Fills T, U, Kcorr, Khat from w, k, beta.
void chunk_key_side(const ChunkFactors& f);

// For one query head's rows q [n, D]: QWl = lower(q W^T) [n, n] (diagonal included), Qhat = q - QWl U [n, D]
// (Eq. 13) and the intra-chunk scores S = lower(q K^T) - QWl Kcorr [n, n] (Eq. 12; zero above the diagonal).
void chunk_query_side(const ChunkFactors& f, const float* q, float* QWl, float* Qhat, float* S);

// Backward of chunk_query_side for one query head: given dQhat [n, D] and dS [n, n] (zero above the diagonal),
// accumulates into dq, dk, dw [n, D], dU [n, D] and dKcorr [n, n] (Eq. 26-28).
void chunk_query_side_backward(const ChunkFactors& f, const float* q, const float* QWl, const float* dQhat,
                               const float* dS, float* dq, float* dk, float* dw, float* dU, float* dKcorr);

// Backward of chunk_key_side: given dU [n, D], dKcorr [n, n] and dKhat [n, D], accumulates into dk, dw [n, D]
// and dbeta [n] (Eq. 29-30).
void chunk_key_side_backward(const ChunkFactors& f, const float* dU, const float* dKcorr, const float* dKhat,
                             float* dk, float* dw, float* dbeta);

}  // namespace pathattn::cpu
