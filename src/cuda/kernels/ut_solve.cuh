// The UT factor's triangular solve T = (I + A)^{-1} for a strictly lower triangular C x C tile A (docs/math.md
// Eq. 10), in two forms: plain f32 forward substitution (the f32 preprocess, prep.cuh) and the blocked tensor-core
// solve (prep_tc.cuh and the chunk-local backward, bwd_local.cuh).
#pragma once

#include "cuda/kernels/tf32.cuh"

namespace pathattn::cuda {

// By forward substitution, one column per thread: T[i][c] = [i == c] - sum_{c <= l < i} A[i][l] T[l][c]. Columns are
// independent, so there is no barrier inside; the caller synchronises before reading T.
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

namespace ut_tc_detail {

// The off-diagonal blocks in 3xTF32 (a = hi + lo, a b ~ hi hi + hi lo + lo hi): errors of T enter every factor, so
// the solve keeps ~f32 accuracy; false would give plain TF32 (a third of the solve's mma).
constexpr bool kSolve3xTf32 = true;

// acc[16 x 16] += A[16 x 16] B[16 x 16] on f32 values (mma_f32_split), in the pair k order (lane t takes k = 2t and
// 2t + 1 of each 8-wide k step, as slots t and t + 4: the mma sums its k slots in any order as long as A and B agree):
// afrag(ks, a) fills the A fragment of k step ks (a0 = A(g, 8ks + 2t), a1 = A(g + 8, ..), a2 = A(g, 8ks + 2t + 1),
// a3 = A(g + 8, ..)); b2(k, n) = {B(k, n), B(k + 1, n)}. In this order the accumulator of n tile ks is exactly the A
// fragment of k step ks of a next product: {c0, c2, c1, c3}.
template <typename FA, typename FB>
__device__ __forceinline__ void tile16_f32(float (&acc)[2][4], FA afrag, FB b2) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    float a[4];
    afrag(ks, a);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float2 bb = b2(8 * ks + 2 * t, 8 * nt + g);
      mma_f32_split<kSolve3xTf32>(acc[nt], a, bb.x, bb.y);
    }
  }
}

// One 16 x 16 block (i, j), i > j, of T = (I + A)^{-1}, from the recursive 2 x 2 form T_BA = -T_BB A_BA T_AA
// (B = block rows k0..i of the level, A = block columns j..l1), in s (row stride LS) that holds T on and below the
// blocks already solved and A elsewhere. Transposed, T_ij^T = -sum_{k=k0..i} Z_k T_ik^T with
// Z_k = sum_{l=j..l1} T_lj^T A_kl^T, so that Z_k's accumulator is the A fragment of the outer product (no staging
// through shared memory). Returns -T_ij^T in the accumulator layout: r[nt][e] = T_ij(8nt + 2t + e % 2, g + 8 (e / 2)).
template <int LS, int NK, int NL>
__device__ __forceinline__ void solve_block(const float* s, int i, int j, int k0, int l1, float (&r)[2][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  zero_acc(r);
#pragma unroll
  for (int kk = 0; kk < NK; ++kk) {
    const int k = k0 + kk;
    if (k > i) continue;  // warp-uniform
    float z[2][4];
    zero_acc(z);
#pragma unroll
    for (int ll = 0; ll < NL; ++ll) {
      const int l = j + ll;
      if (l > l1) continue;
      // A operand T_lj^T(m, q) = T_lj(q, m); B operand A_kl^T(q, n) = A_kl(n, q), a row of A.
      tile16_f32(
          z,
          [&](int ks, float(&a)[4]) {
            const float* p = s + (16 * l + 8 * ks + 2 * t) * LS + 16 * j + g;
            a[0] = p[0];
            a[1] = p[8];
            a[2] = p[LS];
            a[3] = p[LS + 8];
          },
          [&](int q, int n) { return *reinterpret_cast<const float2*>(s + (16 * k + n) * LS + 16 * l + q); });
    }
    // B operand T_ik^T(q, n) = T_ik(n, q), a row of T.
    tile16_f32(
        r,
        [&](int ks, float(&a)[4]) {
          a[0] = z[ks][0];
          a[1] = z[ks][2];
          a[2] = z[ks][1];
          a[3] = z[ks][3];
        },
        [&](int q, int n) { return *reinterpret_cast<const float2*>(s + (16 * i + n) * LS + 16 * k + q); });
  }
}

// Writes T_ij from solve_block's result.
template <int LS>
__device__ __forceinline__ void store_block(float* s, int i, int j, const float (&r)[2][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[(16 * i + 8 * nt + 2 * t + e % 2) * LS + 16 * j + g + 8 * (e / 2)] = -r[nt][e];
}

}  // namespace ut_tc_detail

// T = (I + A)^{-1} in place for a 64 x 64 tile s (row stride LS, f32) holding A, strictly lower triangular, zero on
// and above the diagonal; ends with T (unit lower triangular, zero above) and a barrier. Blocked in 16 x 16: the four
// diagonal blocks by forward substitution (one column per thread, f32, threads 0-63), then the recursive 2 x 2 form
// T_BA = -T_BB A_BA T_AA: blocks (1,0) and (3,2) (warps 0 and 1), then the 32 x 32 block of rows 2-3, columns 0-1
// (warps 0-3, one block each). Loops have compile-time bounds and are unrolled, so the loads of a dependency chain
// are issued ahead of its FMAs (prep_tc's v3 had variable-bound loops: load-latency chains). Every thread of a CTA of
// at least 4 warps calls it (barriers inside); LS = 8 (mod 32) keeps the fragment loads on distinct banks.
// (The chunk-local backward's earlier solve, four threads per column over the whole tile, took ~17 us per task on
// the H100: 8.6 of its 44 ms at 32 x 4096, D = 64, docs/perf/notes.md v14.)
template <int LS>
__device__ __forceinline__ void ut_solve_tc(float* s) {
  using namespace ut_tc_detail;
  static_assert(LS % 32 == 8 && LS >= 64, "row stride: 8 (mod 32), at least the tile's width");
  const int tid = threadIdx.x, warp = tid / 32;
  {
    float col[16];  // column c of the diagonal block, in registers until every thread has read A's block
    const int b0 = (tid / 16) * 16, c = tid % 16;
    if (tid < 64) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float sum = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (4 * q < i) {
            const float4 a = *reinterpret_cast<const float4*>(s + (b0 + i) * LS + b0 + 4 * q);
            const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (4 * q + e < i) sum = fmaf(av[e], col[4 * q + e], sum);
          }
        col[i] = i < c ? 0.f : (i == c ? 1.f : -sum);  // rows above c: col[l] = 0 there, so the sum starts at c
      }
    }
    __syncthreads();
    if (tid < 64) {
#pragma unroll
      for (int i = 0; i < 16; ++i) s[(b0 + i) * LS + b0 + c] = col[i];
    }
    __syncthreads();
  }
  if (warp < 2) {  // T_10 = -T_11 A_10 T_00 (warp 0), T_32 = -T_33 A_32 T_22 (warp 1): disjoint tiles
    const int i = 1 + 2 * warp, j = 2 * warp;
    float r[2][4];
    solve_block<LS, 1, 1>(s, i, j, i, j, r);
    __syncwarp();  // every lane's reads of A_ij are done
    store_block<LS>(s, i, j, r);
  }
  __syncthreads();
  {  // rows 2-3, columns 0-1: one block per warp; A_BA is read across warps, so store after a barrier
    const int i = 2 + warp / 2, j = warp % 2;
    float r[2][4];
    if (warp < 4) solve_block<LS, 2, 2>(s, i, j, 2, 1, r);
    __syncthreads();
    if (warp < 4) store_block<LS>(s, i, j, r);
  }
  __syncthreads();
}

}  // namespace pathattn::cuda
