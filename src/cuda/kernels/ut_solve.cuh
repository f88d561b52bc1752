// The UT factor's triangular solve in plain f32 (docs/math.md Eq. 10): T = (I + A)^{-1} for a strictly lower
// triangular A, by forward substitution, one column per thread: T[i][c] = [i == c] - sum_{c <= l < i} A[i][l] T[l][c].
// Columns are independent, so there is no barrier inside; the caller synchronises before reading T. Used by the f32
// preprocess (prep.cuh) and the chunk-local backward (bwd_local.cuh); prep_tc.cuh has the blocked tensor-core solve.
#pragma once

namespace pathattn::cuda {

template <int C>
__device__ __forceinline__ void ut_solve_f32(const float* A, int lda, float* T, int ldt) {
  if (threadIdx.x < C) {
    const int c = threadIdx.x;
    for (int i = 0; i < C; ++i) {
      float s = 0.f;
      for (int l = c; l < i; ++l) s = fmaf(A[i * lda + l], T[l * ldt + c], s);
      T[i * ldt + c] = i < c ? 0.f : (i == c ? 1.f : -s);
    }
  }
}

}  // namespace pathattn::cuda
