// The TF32 wgmma products of kernels/wgmma.cuh (m64n64k8, both operands K-major in swizzle.h's swz128<4> layout,
// A from shared memory or from registers) against the f64 product on the host: the building block of the
// preprocess's next form (docs/perf/notes.md "Preprocess v8"). The inputs are TF32-exact (10-bit mantissas), so
// every product is exact in f32 and only the f32 sums' order separates the kernel from f64. Label gpu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/kernels/wgmma.cuh"
#include "cuda/swizzle.h"

namespace pathattn::cuda {
namespace {

constexpr int N = 64;  // rows, columns and k of the product

// C[64 x 64] = A[64 x 64] B[64 x 64], B given as B^T ([n][k], K-major); kRegA: A's fragments from registers.
template <bool kRegA>
__global__ void __launch_bounds__(128) wgmma_tf32_product(const float* a, const float* bt, float* c) {
  __shared__ __align__(1024) float sa[N * N];
  __shared__ __align__(1024) float sb[N * N];
  for (int i = threadIdx.x; i < N * N; i += blockDim.x) {
    const int r = i / N, k = i % N;
    sa[swz128<4>(r, k, N)] = a[i];
    sb[swz128<4>(r, k, N)] = bt[i];
  }
  fence_proxy_async_smem();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float acc[8][4] = {};  // (the first step overwrites it; zeroed so that no operand is read undefined)
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk) {
    if constexpr (kRegA) {
      const int r = 16 * warp + g, k = 8 * kk + t;
      const uint32_t f[4] = {__float_as_uint(sa[swz128<4>(r, k, N)]), __float_as_uint(sa[swz128<4>(r + 8, k, N)]),
                             __float_as_uint(sa[swz128<4>(r, k + 4, N)]),
                             __float_as_uint(sa[swz128<4>(r + 8, k + 4, N)])};
      wgmma_m64n64k8_tf32_rs(acc, f, wgmma_desc_tf32_k8(sb, kk), kk > 0);
    } else {
      wgmma_m64n64k8_tf32_ss(acc, wgmma_desc_tf32_k8(sa, kk), wgmma_desc_tf32_k8(sb, kk), kk > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(acc);
  // The accumulator layout (wgmma.cuh): warp w's rows 16w.., lane (g, t) columns 8 nt + 2t, + 1 of rows g, g + 8.
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[(16 * warp + g + 8 * (e / 2)) * N + 8 * nt + 2 * t + e % 2] = acc[nt][e];
}

// A float with a 10-bit mantissa (TF32-exact): the low 13 bits cleared.
float tf32_exact(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

::testing::AssertionResult ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << cudaGetErrorString(e);
}

template <bool kRegA>
void run_and_compare() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> a(N * N), bt(N * N), c(N * N, NAN);
  for (float& x : a) x = tf32_exact(nd(rng));
  for (float& x : bt) x = tf32_exact(nd(rng));
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  ASSERT_TRUE(ok(cudaMalloc(&da, N * N * 4), "cudaMalloc a"));
  ASSERT_TRUE(ok(cudaMalloc(&db, N * N * 4), "cudaMalloc b"));
  ASSERT_TRUE(ok(cudaMalloc(&dc, N * N * 4), "cudaMalloc c"));
  ASSERT_TRUE(ok(cudaMemcpy(da, a.data(), N * N * 4, cudaMemcpyHostToDevice), "copy a"));
  ASSERT_TRUE(ok(cudaMemcpy(db, bt.data(), N * N * 4, cudaMemcpyHostToDevice), "copy b"));
  ASSERT_TRUE(ok(cudaMemset(dc, 0xff, N * N * 4), "memset c"));  // NaN where the kernel writes nothing
  wgmma_tf32_product<kRegA><<<1, 128>>>(da, db, dc);
  ASSERT_TRUE(ok(cudaGetLastError(), "launch wgmma_tf32_product"));
  ASSERT_TRUE(ok(cudaDeviceSynchronize(), "wgmma_tf32_product"));
  ASSERT_TRUE(ok(cudaMemcpy(c.data(), dc, N * N * 4, cudaMemcpyDeviceToHost), "copy c"));
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  int bad = 0;
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (int k = 0; k < N; ++k) {
        ref += static_cast<double>(a[i * N + k]) * bt[j * N + k];
        mag += std::fabs(static_cast<double>(a[i * N + k]) * bt[j * N + k]);
      }
      // Exact products, 64 f32 additions in some order: at most 64 roundings of 2^-24 of the running magnitude.
      const double got = c[i * N + j];
      if (!(std::fabs(got - ref) <= 64 * 0x1p-24 * mag) && ++bad <= 5)
        ADD_FAILURE() << "C(" << i << ", " << j << ") = " << got << ", f64 " << ref;
    }
  EXPECT_EQ(bad, 0);
}

TEST(CudaWgmmaTf32, SharedOperandsMatchF64) { run_and_compare<false>(); }
TEST(CudaWgmmaTf32, RegisterAMatchesF64) { run_and_compare<true>(); }

}  // namespace
}  // namespace pathattn::cuda
