// The one place where runtime values (dtype, head dimension, gate, key cache) become template arguments.
#include "cuda/dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>

#include "cuda/check.h"
#include "cuda/launch/launch.h"

namespace pathattn::cuda {
namespace {

// PATHATTN_CUDA_PROFILE=1 prints each stage's time (CUDA events, synchronising): for docs/perf/notes.md.
struct StageTimer {
  bool on = std::getenv("PATHATTN_CUDA_PROFILE") != nullptr;
  cudaStream_t stream;
  cudaEvent_t last{};
  explicit StageTimer(cudaStream_t s) : stream(s) {
    if (!on) return;
    CUDA_CHECK(cudaEventCreate(&last));
    CUDA_CHECK(cudaEventRecord(last, stream));
  }
  void mark(const char* name) {
    if (!on) return;
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(e, stream));
    CUDA_CHECK(cudaEventSynchronize(e));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, last, e));
    std::fprintf(stderr, "[pathattn profile] %-8s %8.3f ms\n", name, ms);
    CUDA_CHECK(cudaEventDestroy(last));
    last = e;
  }
  ~StageTimer() {
    if (on) cudaEventDestroy(last);
  }
};

template <typename T, int D>
void run_typed(const Params& p, bool gate, bool kcache, cudaStream_t stream) {
  StageTimer timer(stream);
  if (gate) launch_gate(p, stream);
  timer.mark("gate");
  // The key cache's suffix products read f32 copies of K^, U, W that only the all-f32 preprocess writes.
  if (kcache)
    launch_prep<T, D>(p, stream);
  else
    launch_prep_tc<T, D>(p, stream);
  timer.mark("prep");
  if (gate)
    launch_fwd<T, D, true>(p, stream);
  else
    launch_fwd<T, D, false>(p, stream);
  timer.mark("main");
  if (kcache) launch_kcache<T, D>(p, stream);
  timer.mark("kcache");
}

template <typename T>
void run_dim(const Params& p, int D, bool gate, bool kcache, cudaStream_t stream) {
  if (D == 64)
    run_typed<T, 64>(p, gate, kcache, stream);
  else
    run_typed<T, 128>(p, gate, kcache, stream);
}

}  // namespace

void run_forward(const Params& p, DType dtype, int D, bool gate, bool kcache, cudaStream_t stream) {
  if (dtype == DType::bf16)
    run_dim<__nv_bfloat16>(p, D, gate, kcache, stream);
  else
    run_dim<__half>(p, D, gate, kcache, stream);
}

}  // namespace pathattn::cuda
