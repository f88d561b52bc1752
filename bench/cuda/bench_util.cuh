// Helpers shared by the CUDA benchmark programs (bench_fwd.cu, bench_decode.cu): a checked CUDA call that exits
// with the failing call, and cheap deterministic device-side random inputs (no host upload of large tensors).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s failed: %s at %s:%d\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace pathattn_bench {

__device__ inline float hash_normal(uint64_t i, uint64_t seed) {
  // Two uniform draws from a 64-bit mix, Box-Muller: cheap, deterministic, good enough for timing inputs.
  auto mix = [](uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
  };
  const uint64_t a = mix(i * 2 + seed * 0x9E3779B97F4A7C15ULL), b = mix(i * 2 + 1 + seed * 0x9E3779B97F4A7C15ULL);
  const float u1 = ((a >> 40) + 1.0f) / 16777217.0f, u2 = (b >> 40) / 16777216.0f;
  return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
}

__global__ void fill_bf16(__nv_bfloat16* x, int64_t n, uint64_t seed, float scale = 1.f) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16(scale * hash_normal(i, seed));
}
// Unit-norm rows of D (one warp per row).
__global__ void fill_w(float* w, int64_t rows, int D, uint64_t seed) {
  const int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  float ss = 0;
  for (int d = lane; d < D; d += 32) {
    const float x = hash_normal(r * D + d, seed);
    w[r * D + d] = x;
    ss += x * x;
  }
  for (int o = 16; o; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  for (int d = lane; d < D; d += 32) w[r * D + d] *= rsqrtf(ss);
}

}  // namespace pathattn_bench
