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

// The same with four threads per column (blocks of at least 4 C threads; the rest idle): each sums every fourth
// term, a fixed shuffle order adds the four, and the column's lane 0 writes T[i][c]. The serial chain per row is
// a quarter as long: the one-thread-per-column version took ~35 us per call in the chunk-local backward (7 of its
// 72 ms at 32 x 4096, docs/perf/notes.md). A column's four threads are consecutive lanes of one warp, so a warp
// barrier orders a row's write before the next row's reads.
template <int C>
__device__ __forceinline__ void ut_solve_f32_x4(const float* A, int lda, float* T, int ldt) {
  if (threadIdx.x < 4 * C) {
    const int c = threadIdx.x / 4, q = threadIdx.x % 4;
    for (int i = 0; i < C; ++i) {
      float s = 0.f;
      for (int l = c + q; l < i; l += 4) s = fmaf(A[i * lda + l], T[l * ldt + c], s);
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (q == 0) T[i * ldt + c] = i < c ? 0.f : (i == c ? 1.f : -s);
      __syncwarp();
    }
  }
}

}  // namespace pathattn::cuda
