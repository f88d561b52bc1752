// Question: how close is one CUDA decoding step (pathattn::decode, one new token per sequence) to the memory floor?
// A step must read every cached key, write it back carried (docs/math.md Eq. 3) and read every cached value:
// 3 x 4 D bytes per cached row per kv head (the f32 cache), i.e. B x L x H x D x 12 bytes. The floor is that over
// the copy ceiling measured on this H200 (4.3 TB/s, device-to-device copy; docs/perf/notes.md). Below ~50 MB of
// cache (the L2) the step can run above it.
//
// Per shape: the median over --iters steps of (a) the eager call (pathattn::decode from the host per step: host
// work, the workspace's stream ordering and two launches) and (b) the same step captured once in a CUDA graph and
// replayed (the kernels alone), both timed with CUDA events on one stream; the achieved bandwidth of (b) and its % of
// 4.3 TB/s. The cache starts at length L and grows by one row per step (+2.5% at L = 4k over the 2 x 50 steps).
// Shapes: L in {4k, 16k, 64k, 128k} x B in {1, 8, 64} x D in {64, 128}, H = 8 kv heads, HQ = 32 (GQA 4:1), no gate
// (--gate adds it); a shape whose cache exceeds --max-gb is skipped.
//
// --ckpt P: the checkpointed cache (docs/math.md Eq. 35-37) with its
// checkpoint at L: old rows only read (B L H D x 8 bytes), the pending ones carried, one refresh every P steps
// (B L H D x 8 more); the graph column is then the mean over the replays (refresh steps included), and the bytes
// B L H D (8 + 8 / P).
//
// --cache bf16: bf16 keys and values (the layer's low-precision cache): half the bytes of every row, so the bytes
// per element pair are 6 (plain) and 4 + 4 / P (checkpointed).
//
// --tokens S: S new tokens per call (speculative decoding's verification step): the columns are per call, and the
// bytes count one pass over the cache per 64 tokens (the chunked call, kernels/decode_chunk.cuh, the default for
// S >= 4; PATHATTN_DECODE_CHUNK=0 gives S single steps, S passes, whose bandwidth this column understates by
// S / ceil(S / 64): compare the us columns). us/token = graph us / S.
//
//   bench_decode_cuda [--iters N] [--only D] [--H H] [--HQ HQ] [--gate] [--max-gb G] [--shape B,L,D] [--ckpt P]
//                     [--cache f32|bf16] [--tokens S]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_util.cuh"
#include "pathattn/pathattn.h"


namespace {

using namespace pathattn_bench;

__global__ void fill_f32(float* x, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    x[i] = scale * hash_normal(i, seed);
}

constexpr double kCopyTBs = 4.3;  // device-to-device copy ceiling measured on this H200 (docs/perf/notes.md)

__global__ void fill_const(float* x, int64_t n, float c) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) x[i] = c;
}
// Cumulative gates of a cache: G_t = -0.01 t (f64), so that G_t - G_j stays moderate at long L.
__global__ void fill_gcum(double* g, int64_t B, int64_t Tmax, int HQ) {
  const int64_t n = B * Tmax * HQ;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    g[i] = -0.01 * static_cast<double>((i / HQ) % Tmax);
}

struct Shape {
  int B, L, D;
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50, only_d = 0, H = 8, HQ = 32, ckpt_period = 0, S = 1;
  bool gate = false, bf16_cache = false;
  double max_gb = 80;
  Shape one{0, 0, 0};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only_d = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--H") && i + 1 < argc) H = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--HQ") && i + 1 < argc) HQ = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gate")) gate = true;
    else if (!std::strcmp(argv[i], "--max-gb") && i + 1 < argc) max_gb = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--ckpt") && i + 1 < argc) ckpt_period = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) S = std::clamp(std::atoi(argv[++i]), 1, 1024);
    else if (!std::strcmp(argv[i], "--cache") && i + 1 < argc) {
      const char* c = argv[++i];
      if (std::strcmp(c, "f32") && std::strcmp(c, "bf16")) {
        std::fprintf(stderr, "--cache expects f32 or bf16, got '%s'\n", c);
        return 2;
      }
      bf16_cache = !std::strcmp(c, "bf16");
    } else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc &&
             std::sscanf(argv[++i], "%d,%d,%d", &one.B, &one.L, &one.D) != 3) {
      std::fprintf(stderr, "--shape expects B,L,D (three integers), got '%s'\n", argv[i]);
      return 2;
    }
  }
  if (H < 1 || HQ < H || HQ % H) {
    std::fprintf(stderr, "HQ = %d must be a positive multiple of H = %d\n", HQ, H);
    return 2;
  }
  std::vector<Shape> shapes;
  for (int D : {64, 128})
    for (int L : {4096, 16384, 65536, 131072})
      for (int B : {1, 8, 64})
        if (!only_d || only_d == D) shapes.push_back({B, L, D});
  if (one.B > 0) shapes = {one};

  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int eb = bf16_cache ? 2 : 4;  // bytes per cache element (keys and values alike)
  std::printf("# bench_decode_cuda on %s (%d SMs): one decoding call of %d token(s), bf16 q/k/v, %s cache, H = %d, "
              "HQ = %d, %s, median of %d calls%s\n",
              prop.name, prop.multiProcessorCount, S, bf16_cache ? "bf16" : "f32", H, HQ,
              gate ? "gate (f64 gcum)" : "no gate", iters,
              S > 1 ? (std::getenv("PATHATTN_DECODE_CHUNK") ? ", PATHATTN_DECODE_CHUNK set" : ", chunked if S >= 4")
                    : "");
  if (ckpt_period)
    std::printf("# checkpointed cache, period %d: bytes = B L H D x (%d + %d / %d) (old k read, v read, one rewrite per "
                "period); graph us = the mean over the replays; %% of the %.1f TB/s copy ceiling\n",
                ckpt_period, 2 * eb, 2 * eb, ckpt_period, kCopyTBs);
  else
    std::printf("# bytes = B L H D x %d (cache k read + write, v read); %% of the %.1f TB/s copy ceiling\n", 3 * eb,
                kCopyTBs);
  std::printf("%4s %4s %7s %9s %11s %11s %10s %8s %9s\n", "D", "B", "L", "cache MB", "eager us", "graph us", "TB/s",
              "%ceil", "us/token");

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  void* ws = nullptr;
  std::size_t ws_bytes = 0;

  for (const Shape& s : shapes) {
    const int64_t B = s.B, L = s.L, D = s.D, Tmax = L + S * (2 * iters + 8);  // room for every timed call
    const double cache_bytes = double(B) * Tmax * H * D * eb * 2;
    if (cache_bytes > max_gb * 1e9) {
      std::printf("%4d %4d %7d %9.0f   skipped: cache above --max-gb %.0f\n", s.D, s.B, s.L, cache_bytes / 1e6, max_gb);
      continue;
    }
    void *ck, *cv;
    float *w, *beta, *g = nullptr, *lse;
    double* gcum = nullptr;
    int32_t* len;
    void *q, *k, *v, *o;
    CHECK(cudaMalloc(&ck, B * Tmax * H * D * eb));
    CHECK(cudaMalloc(&cv, B * Tmax * H * D * eb));
    CHECK(cudaMalloc(&len, B * 4));
    CHECK(cudaMalloc(&q, B * S * HQ * D * 2));
    CHECK(cudaMalloc(&k, B * S * H * D * 2));
    CHECK(cudaMalloc(&v, B * S * H * D * 2));
    CHECK(cudaMalloc(&w, B * S * H * D * 4));
    CHECK(cudaMalloc(&beta, B * S * H * 4));
    CHECK(cudaMalloc(&o, B * S * HQ * D * 2));
    CHECK(cudaMalloc(&lse, B * S * HQ * 4));
    if (bf16_cache) {
      fill_bf16<<<4096, 256>>>(static_cast<__nv_bfloat16*>(ck), B * Tmax * H * D, 1, 0.3f);
      fill_bf16<<<4096, 256>>>(static_cast<__nv_bfloat16*>(cv), B * Tmax * H * D, 2, 1.f);
    } else {
      fill_f32<<<4096, 256>>>(static_cast<float*>(ck), B * Tmax * H * D, 1, 0.3f);
      fill_f32<<<4096, 256>>>(static_cast<float*>(cv), B * Tmax * H * D, 2, 1.f);
    }
    fill_bf16<<<256, 256>>>(static_cast<__nv_bfloat16*>(q), B * S * HQ * D, 3);
    fill_bf16<<<256, 256>>>(static_cast<__nv_bfloat16*>(k), B * S * H * D, 4);
    fill_bf16<<<256, 256>>>(static_cast<__nv_bfloat16*>(v), B * S * H * D, 5);
    fill_w<<<(B * S * H + 7) / 8, 256>>>(w, B * S * H, s.D, 6);
    fill_const<<<64, 256>>>(beta, B * S * H, 1.5f);
    if (gate) {
      CHECK(cudaMalloc(&g, B * S * HQ * 4));
      CHECK(cudaMalloc(&gcum, B * Tmax * HQ * 8));
      fill_const<<<64, 256>>>(g, B * S * HQ, -0.01f);
      fill_gcum<<<4096, 256>>>(gcum, B, Tmax, HQ);
    }
    CHECK(cudaGetLastError());
    std::vector<int32_t> hlen(s.B, s.L);
    CHECK(cudaMemcpy(len, hlen.data(), B * 4, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());

    using pathattn::DType;
    const auto dev = pathattn::Device::cuda;
    pathattn::Inputs in;
    in.q = pathattn::make_view(q, DType::bf16, {B, S, HQ, D}, dev);
    in.k = pathattn::make_view(k, DType::bf16, {B, S, H, D}, dev);
    in.v = pathattn::make_view(v, DType::bf16, {B, S, H, D}, dev);
    in.w = pathattn::make_view(w, DType::f32, {B, S, H, D}, dev);
    in.beta = pathattn::make_view(beta, DType::f32, {B, S, H}, dev);
    if (gate) in.g = pathattn::make_view(g, DType::f32, {B, S, HQ}, dev);
    in.cuda_stream = stream;
    in.cuda_workspace = [&](std::size_t bytes) {  // one buffer, grown between shapes (never during a capture)
      if (bytes > ws_bytes) {
        if (ws) CHECK(cudaFree(ws));
        CHECK(cudaMalloc(&ws, bytes));
        ws_bytes = bytes;
      }
      return ws;
    };
    pathattn::DecodeCache cache;
    const DType cache_dtype = bf16_cache ? DType::bf16 : DType::f32;
    cache.k = pathattn::make_view(ck, cache_dtype, {B, Tmax, H, D}, dev);
    cache.v = pathattn::make_view(cv, cache_dtype, {B, Tmax, H, D}, dev);
    if (gate) cache.gcum = pathattn::make_view(gcum, DType::f64, {B, Tmax, HQ}, dev);
    cache.lengths = pathattn::make_view(len, DType::i32, {B}, dev);
    int32_t* ckpt = nullptr;
    float* carry = nullptr;
    if (ckpt_period) {
      CHECK(cudaMalloc(&ckpt, B * 4));
      CHECK(cudaMalloc(&carry, B * H * D * D * 4));
      CHECK(cudaMemcpy(ckpt, hlen.data(), B * 4, cudaMemcpyHostToDevice));  // the checkpoint at L, nothing pending
      cache.ckpt = pathattn::make_view(ckpt, DType::i32, {B}, dev);
      cache.carry = pathattn::make_view(carry, DType::f32, {B, H, D, D}, dev);
      cache.ckpt_period = ckpt_period;
    }
    pathattn::ForwardOutputs out;
    out.o = pathattn::make_view(o, DType::bf16, {B, S, HQ, D}, dev);
    out.lse = pathattn::make_view(lse, DType::f32, {B, S, HQ}, dev);
    auto step = [&] { pathattn::decode(in, cache, out, pathattn::Backend::cuda); };

    // Eager: warm-up (sizes the workspace), then timed steps.
    for (int i = 0; i < 2; ++i) step();
    CHECK(cudaStreamSynchronize(stream));
    std::vector<float> eager(iters), graph(iters);
    for (int i = 0; i < iters; ++i) {
      CHECK(cudaEventRecord(e0, stream));
      step();
      CHECK(cudaEventRecord(e1, stream));
      CHECK(cudaEventSynchronize(e1));
      CHECK(cudaEventElapsedTime(&eager[i], e0, e1));
    }
    // Graph: one step captured, replayed (the remaining rows of Tmax hold the replays).
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    step();
    CHECK(cudaStreamEndCapture(stream, &gr));
    CHECK(cudaGraphInstantiate(&ge, gr, 0));
    CHECK(cudaGraphLaunch(ge, stream));
    for (int i = 0; i < iters; ++i) {
      CHECK(cudaEventRecord(e0, stream));
      CHECK(cudaGraphLaunch(ge, stream));
      CHECK(cudaEventRecord(e1, stream));
      CHECK(cudaEventSynchronize(e1));
      CHECK(cudaEventElapsedTime(&graph[i], e0, e1));
    }
    CHECK(cudaStreamSynchronize(stream));
    double mean_graph = 0;
    for (float x : graph) mean_graph += x / iters;
    const double me = median(eager) * 1e3, mg = (ckpt_period ? mean_graph : median(graph)) * 1e3;  // us
    const double per_elem = ckpt_period ? 2.0 * eb + 2.0 * eb / ckpt_period : 3.0 * eb;
    const double bytes = double(B) * L * H * D * per_elem * ((S + 63) / 64), tbs = bytes / (mg * 1e-6) / 1e12;
    std::printf("%4d %4d %7d %9.0f %11.1f %11.1f %10.2f %7.0f%% %9.2f\n", s.D, s.B, s.L, cache_bytes / 1e6, me, mg,
                tbs, 100.0 * tbs / kCopyTBs, mg / S);
    std::fflush(stdout);
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(gr));
    for (void* p : {ck, cv, (void*)len, q, k, v, (void*)w, (void*)beta, o, (void*)lse, (void*)g,
                    (void*)gcum, (void*)ckpt, (void*)carry})
      if (p) CHECK(cudaFree(p));
  }
  if (ws) CHECK(cudaFree(ws));
  return 0;
}
