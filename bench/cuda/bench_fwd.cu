// Question: how fast are our CUDA forward and backward at the issues' shapes, against the FLOP ceiling?
// Times pathattn::forward (Backend::cuda, bf16, no gate, no kcache) with CUDA events: warm-up, then the median of
// many runs, rotating between input sets so that no run finds its inputs in L2 from the previous one.
// Prints ms, TFLOP/s by FlashAttention's count (4 B HQ D T^2 / 2, causal) and by PaTH's count (that times
// 1 + D / (2 C): one more C x D x D product per key chunk, Q~ E^T of docs/math.md Eq. 32; 1.5x at D = 64, 2x at
// D = 128), and % of 790 TFLOP/s (dense bf16 measured on
// this H200, docs/perf/notes.md). Writes the rows as CSV for bench/cuda/baselines.py. PaTH's count is the per-chunk
// form's: with the two-level forward (PATHATTN_FWD_BLOCK) the kernels do fewer products, and the column reads as an
// effective rate (work of the per-chunk form per second), comparable across block sizes.
//
// With --bwd it also times the backward after that forward (dout random), in deterministic mode (the default,
// ordered cross-block sums) and in the fast mode (Inputs::deterministic = false), and reports the backward's
// workspace (the extra memory it takes, from a counting allocator).
//
//   bench_fwd [--csv FILE] [--iters N] [--only D] [--shape B,T,H,D] [--bwd]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "pathattn/pathattn.h"


namespace {

using namespace pathattn_bench;

constexpr double kPeakTflops = 790.0;  // bf16 dense, measured on this H200 model (KINDS.md: 769-798)

// beta = 2 sigmoid(x): the layer's distribution (docs/spec.md §5), spread over (0, 2).
__global__ void fill_beta(float* b, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    b[i] = 2.f / (1.f + expf(-hash_normal(i, seed)));
}

struct Inputs4 {
  void *q, *k, *v;
  float *w, *beta;
};

struct Shape {
  int B, T, H, D;
};

}  // namespace

int main(int argc, char** argv) {
  std::string csv;
  int iters = 20, only_d = 0;
  bool bwd = false;
  Shape one{0, 0, 0, 0};  // --shape: time this shape only (for profilers)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only_d = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--bwd")) bwd = true;
    else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc &&
             std::sscanf(argv[++i], "%d,%d,%d,%d", &one.B, &one.T, &one.H, &one.D) != 4) {
      std::fprintf(stderr, "--shape expects B,T,H,D (four integers), got '%s'\n", argv[i]);
      return 2;
    }
  }
  std::vector<Shape> shapes;
  for (auto [H, D] : {std::pair{32, 64}, {16, 128}})
    for (auto [B, T] : {std::pair{32, 1024}, {32, 4096}, {8, 16384}})
      if (!only_d || only_d == D) shapes.push_back({B, T, H, D});
  if (one.B > 0) shapes = {one};

  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# bench_fwd on %s (%d SMs), bf16, causal, no gate, HQ = H, %d timed runs (median)\n", prop.name,
              prop.multiProcessorCount, iters);
  FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (out) std::fprintf(out, "B,T,H,D,ms,tflops_fa,tflops_path%s\n", bwd ? ",bwd_ms,bwd_fast_ms,bwd_ws_gb" : "");
  std::printf("%4s %6s %3s %4s %10s %12s %8s %14s", "B", "T", "H", "D", "ms", "TFLOP/s(FA)", "%peak", "TFLOP/s(PaTH)");
  if (bwd) std::printf(" %10s %12s %10s", "bwd ms", "bwd fast ms", "bwd ws GB");
  std::printf("\n");

  for (const Shape& s : shapes) {
    const int64_t nq = int64_t(s.B) * s.T * s.H * s.D, nb = int64_t(s.B) * s.T * s.H;
    constexpr int kSets = 3;
    std::vector<Inputs4> sets(kSets);
    for (int i = 0; i < kSets; ++i) {
      Inputs4& x = sets[i];
      CHECK(cudaMalloc(&x.q, nq * 2));
      CHECK(cudaMalloc(&x.k, nq * 2));
      CHECK(cudaMalloc(&x.v, nq * 2));
      CHECK(cudaMalloc(&x.w, nq * 4));
      CHECK(cudaMalloc(&x.beta, nb * 4));
      fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x.q), nq, 10 * i + 1);
      fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x.k), nq, 10 * i + 2);
      fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x.v), nq, 10 * i + 3);
      fill_w<<<(nb + 7) / 8, 256>>>(x.w, nb, s.D, 10 * i + 4);
      fill_beta<<<1024, 256>>>(x.beta, nb, 10 * i + 5);
      CHECK(cudaGetLastError());
    }
    void *o, *lse, *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *dw = nullptr, *dbeta = nullptr;
    CHECK(cudaMalloc(&o, nq * 2));
    CHECK(cudaMalloc(&lse, nb * 4));
    if (bwd) {
      CHECK(cudaMalloc(&dout, nq * 2));
      CHECK(cudaMalloc(&dq, nq * 2));
      CHECK(cudaMalloc(&dk, nq * 2));
      CHECK(cudaMalloc(&dv, nq * 2));
      CHECK(cudaMalloc(&dw, nq * 4));
      CHECK(cudaMalloc(&dbeta, nb * 4));
      fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(dout), nq, 99);
      CHECK(cudaGetLastError());
    }
    std::size_t ws_bytes = 0;  // the largest workspace a backward call asked for
    auto make_inputs = [&](int i) {
      const Inputs4& x = sets[i % kSets];
      pathattn::Inputs in;
      using pathattn::DType;
      const auto dev = pathattn::Device::cuda;
      in.q = pathattn::make_view(x.q, DType::bf16, {s.B, s.T, s.H, s.D}, dev);
      in.k = pathattn::make_view(x.k, DType::bf16, {s.B, s.T, s.H, s.D}, dev);
      in.v = pathattn::make_view(x.v, DType::bf16, {s.B, s.T, s.H, s.D}, dev);
      in.w = pathattn::make_view(x.w, DType::f32, {s.B, s.T, s.H, s.D}, dev);
      in.beta = pathattn::make_view(x.beta, DType::f32, {s.B, s.T, s.H}, dev);
      return in;
    };
    auto run = [&](int i) {
      using pathattn::DType;
      const auto dev = pathattn::Device::cuda;
      const pathattn::Inputs in = make_inputs(i);
      pathattn::ForwardOutputs fo;
      fo.o = pathattn::make_view(o, DType::bf16, {s.B, s.T, s.H, s.D}, dev);
      fo.lse = pathattn::make_view(lse, DType::f32, {s.B, s.T, s.H}, dev);
      pathattn::forward(in, fo, pathattn::Backend::cuda);
    };
    for (int i = 0; i < 3; ++i) run(i);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ms(iters);
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < iters; ++i) {
      CHECK(cudaEventRecord(e0));
      run(i);
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[iters / 2];
    // The backward after the last forward's o and lse (its inputs set), both modes.
    double bwd_ms[2] = {0, 0};
    void* ws_buf = nullptr;
    if (bwd) {
      using pathattn::DType;
      const auto dev = pathattn::Device::cuda;
      for (int mode = 0; mode < 2; ++mode) {
        auto run_bwd = [&](int i) {
          pathattn::Inputs in = make_inputs(i);
          in.deterministic = mode == 0;
          in.cuda_workspace = [&](std::size_t bytes) {  // one buffer, grown as needed: counts the peak
            if (bytes > ws_bytes) {
              if (ws_buf) CHECK(cudaFree(ws_buf));
              CHECK(cudaMalloc(&ws_buf, bytes));
              ws_bytes = bytes;
            }
            return ws_buf;
          };
          pathattn::Gradients gr;
          gr.dq = pathattn::make_view(dq, DType::bf16, {s.B, s.T, s.H, s.D}, dev);
          gr.dk = pathattn::make_view(dk, DType::bf16, {s.B, s.T, s.H, s.D}, dev);
          gr.dv = pathattn::make_view(dv, DType::bf16, {s.B, s.T, s.H, s.D}, dev);
          gr.dw = pathattn::make_view(dw, DType::f32, {s.B, s.T, s.H, s.D}, dev);
          gr.dbeta = pathattn::make_view(dbeta, DType::f32, {s.B, s.T, s.H}, dev);
          pathattn::backward(in, pathattn::make_view(o, DType::bf16, {s.B, s.T, s.H, s.D}, dev),
                             pathattn::make_view(lse, DType::f32, {s.B, s.T, s.H}, dev),
                             pathattn::make_view(dout, DType::bf16, {s.B, s.T, s.H, s.D}, dev), gr,
                             pathattn::Backend::cuda);
        };
        const int last = (iters - 1) % kSets;  // o and lse belong to this set
        run_bwd(last);
        CHECK(cudaDeviceSynchronize());
        std::vector<float> bm(std::max(3, iters / 2));
        for (float& t : bm) {
          CHECK(cudaEventRecord(e0));
          run_bwd(last);
          CHECK(cudaEventRecord(e1));
          CHECK(cudaEventSynchronize(e1));
          CHECK(cudaEventElapsedTime(&t, e0, e1));
        }
        std::sort(bm.begin(), bm.end());
        bwd_ms[mode] = bm[bm.size() / 2];
      }
    }
    const double fa = 4.0 * s.B * s.H * s.D * double(s.T) * s.T / 2.0;
    const double tf = fa / (med * 1e-3) / 1e12;
    const double path_factor = 1.0 + s.D / (2.0 * 64);  // chunk C = 64
    std::printf("%4d %6d %3d %4d %10.3f %12.1f %7.1f%% %14.1f", s.B, s.T, s.H, s.D, med, tf, 100.0 * tf / kPeakTflops,
                path_factor * tf);
    if (bwd) std::printf(" %10.3f %12.3f %10.3f", bwd_ms[0], bwd_ms[1], ws_bytes / 1e9);
    std::printf("\n");
    if (out) {
      std::fprintf(out, "%d,%d,%d,%d,%.4f,%.2f,%.2f", s.B, s.T, s.H, s.D, med, tf, path_factor * tf);
      if (bwd) std::fprintf(out, ",%.4f,%.4f,%.4f", bwd_ms[0], bwd_ms[1], ws_bytes / 1e9);
      std::fprintf(out, "\n");
    }
    if (ws_buf) CHECK(cudaFree(ws_buf));
    for (void* b : {dout, dq, dk, dv, dw, dbeta})
      if (b) CHECK(cudaFree(b));
    std::fflush(stdout);
    for (Inputs4& x : sets) {
      cudaFree(x.q);
      cudaFree(x.k);
      cudaFree(x.v);
      cudaFree(x.w);
      cudaFree(x.beta);
    }
    cudaFree(o);
    cudaFree(lse);
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
  }
  if (out) std::fclose(out);
  return 0;
}
