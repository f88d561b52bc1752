// Times the fused w path (pathattn::short_conv_w and short_conv_w_backward, Backend::cuda; kernels/short_conv.cuh,
// kernels/short_conv_vec.cuh) without torch: bf16 u, f32 weight, K 4, at the training step's shape and two larger
// ones; CUDA events, median of --iters runs after a warm-up. Beside each: the bytes each call must move and that
// rate as a share of a device-to-device copy measured in the same run. The form is PATHATTN_SHORT_CONV's (vec, the
// default, or rows), read once per process: tools/gpu_check.sh runs this program once per form.
//   bench_short_conv_cuda [--iters N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_util.cuh"
#include "pathattn/pathattn.h"

using pathattn::DType;
using namespace pathattn_bench;

namespace {

struct Shape {
  int B, T, H, D, K;
};

template <typename F>
float median_ms(int iters, F&& run) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  run();  // warm-up
  std::vector<float> ms(static_cast<std::size_t>(iters));
  for (float& m : ms) {
    CHECK(cudaEventRecord(e0));
    run();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&m, e0, e1));
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

__global__ void fill_f32(float* x, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    x[i] = scale * hash_normal(i, seed);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_short_conv_cuda [--iters N]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const char* form = std::getenv("PATHATTN_SHORT_CONV");

  // The copy ceiling: a 1 GiB device-to-device copy (read + write).
  const std::size_t copy_bytes = std::size_t{1} << 30;
  void *src, *dst;
  CHECK(cudaMalloc(&src, copy_bytes));
  CHECK(cudaMalloc(&dst, copy_bytes));
  const float copy_ms = median_ms(10, [&] { CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e6);
  std::printf("# bench_short_conv_cuda on %s, form %s, bf16 u, f32 weight, median of %d; copy ceiling %.0f GB/s\n",
              prop.name, form ? form : "vec (default)", iters, copy_gbs);
  std::printf("| B x T | H x D | K | fwd ms | bwd ms | fwd GB/s (%% copy) | bwd GB/s (%% copy) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");

  const auto dev = pathattn::Device::cuda;
  for (const Shape& s : {Shape{8, 4096, 12, 64, 4}, Shape{32, 4096, 32, 64, 4}, Shape{16, 4096, 16, 128, 4}}) {
    const int64_t C = int64_t{s.H} * s.D, n = int64_t{s.B} * s.T * C;
    void *u, *du;
    float *weight, *w, *dw, *dweight;
    CHECK(cudaMalloc(&u, n * 2));
    CHECK(cudaMalloc(&du, n * 2));
    CHECK(cudaMalloc(&w, n * 4));
    CHECK(cudaMalloc(&dw, n * 4));
    CHECK(cudaMalloc(&weight, C * s.K * 4));
    CHECK(cudaMalloc(&dweight, C * s.K * 4));
    fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(u), n, 1);
    fill_f32<<<1024, 256>>>(dw, n, 2, 1.f);
    fill_f32<<<64, 256>>>(weight, C * s.K, 3, 0.5f);
    CHECK(cudaGetLastError());
    pathattn::ShortConvW in;
    in.u = pathattn::make_view(u, DType::bf16, {s.B, s.T, C}, dev);
    in.weight = pathattn::make_view(weight, DType::f32, {C, s.K}, dev);
    in.head_dim = s.D;
    const pathattn::TensorView wv = pathattn::make_view(w, DType::f32, {s.B, s.T, s.H, s.D}, dev);
    const pathattn::TensorView dwv = pathattn::make_view(dw, DType::f32, {s.B, s.T, s.H, s.D}, dev);
    const pathattn::TensorView duv = pathattn::make_view(du, DType::bf16, {s.B, s.T, C}, dev);
    const pathattn::TensorView dwtv = pathattn::make_view(dweight, DType::f32, {C, s.K}, dev);
    const float fwd = median_ms(iters, [&] { pathattn::short_conv_w(in, wv, pathattn::Backend::cuda); });
    const float bwd = median_ms(iters, [&] {
      pathattn::short_conv_w_backward(in, dwv, duv, dwtv, pathattn::TensorView(), pathattn::Backend::cuda);
    });
    CHECK(cudaDeviceSynchronize());
    // Bytes each call must move: forward u (2) in, w (4) out per element; backward u (2) and dw (4) in, du (2) out.
    const double fwd_gbs = 6.0 * n / (fwd * 1e6), bwd_gbs = 8.0 * n / (bwd * 1e6);
    std::printf("| %d x %d | %d x %d | %d | %.3f | %.3f | %.0f (%.0f%%) | %.0f (%.0f%%) |\n", s.B, s.T, s.H, s.D, s.K, fwd,
                bwd, fwd_gbs, 100.0 * fwd_gbs / copy_gbs, bwd_gbs, 100.0 * bwd_gbs / copy_gbs);
    for (void* p : {u, du, static_cast<void*>(w), static_cast<void*>(dw), static_cast<void*>(weight),
                    static_cast<void*>(dweight)})
      CHECK(cudaFree(p));
  }
  return 0;
}
