// The one place where runtime values (dtype, head dimension, gate, key cache) become template arguments.
#include "cuda/dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>

#include "common/env.h"
#include "cuda/check.h"
#include "cuda/launch/decode_launch.h"
#include "cuda/launch/launch.h"

namespace pathattn::cuda {
namespace {

// PATHATTN_CUDA_PROFILE=1 prints each stage's time (CUDA events, synchronising): for docs/perf/notes.md.
struct StageTimer {
  bool on = env::flag("PATHATTN_CUDA_PROFILE", false);
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
    if (on) (void)cudaEventDestroy(last);  // unchecked: a destructor may not throw
  }
};

template <typename T, int D>
void run_typed(const FwdParams& p, bool gate, bool kcache, cudaStream_t stream) {
  StageTimer timer(stream);
  if (gate) launch_gate(p, stream);
  timer.mark("gate");
  // The key cache's suffix products read f32 copies of K^, U, W that only the all-f32 preprocess writes.
  if (kcache)
    launch_prep<T, D>(p, stream);
  else
    launch_prep_tc<T, D>(p, stream);
  timer.mark("prep");
  if (p.carry_block > 0) {  // the two-level forward's K' and block steps (docs/math.md Eq. 52, 53)
    launch_fwd_block_carry<T, D>(p, stream);
    timer.mark("blocks");
  }
  if (gate)
    launch_fwd<T, D, true>(p, stream);
  else
    launch_fwd<T, D, false>(p, stream);
  timer.mark("main");
  if (kcache) launch_kcache<T, D>(p, stream);
  timer.mark("kcache");
}

template <typename T>
void run_dim(const FwdParams& p, int D, bool gate, bool kcache, cudaStream_t stream) {
  if (D == 64)
    run_typed<T, 64>(p, gate, kcache, stream);
  else
    run_typed<T, 128>(p, gate, kcache, stream);
}

template <typename T, int D, bool kGate, bool kDet>
void run_backward_typed(const BwdParams& p, const BwdGrid& grid, cudaStream_t stream) {
  StageTimer timer(stream);
  // The forward's per-chunk quantities, recomputed (they are not kept between forward and backward): the gate's
  // cumulation and the UT factors (Eq. 10-14, 32) in the tensor-core dtype.
  if (kGate) launch_gate(p, stream);
  launch_prep_tc<T, D>(p, stream);
  timer.mark("prep");
  launch_bwd<T, D, kGate, kDet>(p, grid, stream, [&](const char* stage) { timer.mark(stage); });
}

// f.template call<T, D, kGate, kDet>() for the runtime values: one ladder for every backward entry point.
template <typename T, int D, bool kGate, typename F>
auto by_det(bool det, const F& f) {
  return det ? f.template call<T, D, kGate, true>() : f.template call<T, D, kGate, false>();
}
template <typename T, int D, typename F>
auto by_gate(bool gate, bool det, const F& f) {
  return gate ? by_det<T, D, true>(det, f) : by_det<T, D, false>(det, f);
}
template <typename T, typename F>
auto by_dim(int D, bool gate, bool det, const F& f) {
  return D == 64 ? by_gate<T, 64>(gate, det, f) : by_gate<T, 128>(gate, det, f);
}
template <typename F>
auto with_bwd_types(DType dtype, int D, bool gate, bool det, const F& f) {
  return dtype == DType::bf16 ? by_dim<__nv_bfloat16>(D, gate, det, f) : by_dim<__half>(D, gate, det, f);
}

struct GridFn {
  int group;
  template <typename T, int D, bool kGate, bool kDet>
  BwdGrid call() const {
    return bwd_grid<T, D, kGate, kDet>(group);
  }
};
struct RunBwdFn {
  const BwdParams& p;
  const BwdGrid& grid;
  cudaStream_t stream;
  template <typename T, int D, bool kGate, bool kDet>
  int call() const {
    run_backward_typed<T, D, kGate, kDet>(p, grid, stream);
    return 0;
  }
};

}  // namespace

void run_forward(const FwdParams& p, DType dtype, int D, bool gate, bool kcache, cudaStream_t stream) {
  if (dtype == DType::bf16)
    run_dim<__nv_bfloat16>(p, D, gate, kcache, stream);
  else
    run_dim<__half>(p, D, gate, kcache, stream);
}

}  // namespace pathattn::cuda

namespace pathattn::cuda {

BwdGrid backward_grid(DType dtype, int D, bool gate, bool det, int group) {
  return with_bwd_types(dtype, D, gate, det, GridFn{group});
}

void run_backward(const BwdParams& p, const BwdGrid& grid, DType dtype, int D, bool gate, cudaStream_t stream) {
  with_bwd_types(dtype, D, gate, p.deterministic, RunBwdFn{p, grid, stream});
}

}  // namespace pathattn::cuda

namespace pathattn::cuda {
namespace {

// Query heads per pass of the decode's split kernel: the group rounded up to a power of two, at most 8 (larger
// groups take several passes over the block's rows; registers hold kG queries and outputs per lane).
template <typename T, int D>
void run_decode_dim(const DecodeParams& p, int S, cudaStream_t stream) {
  if (p.group <= 1)
    launch_decode<T, D, 1>(p, S, stream);
  else if (p.group <= 2)
    launch_decode<T, D, 2>(p, S, stream);
  else if (p.group <= 4)
    launch_decode<T, D, 4>(p, S, stream);
  else
    launch_decode<T, D, 8>(p, S, stream);
}

template <typename T>
void run_decode_typed(const DecodeParams& p, int D, int S, cudaStream_t stream) {
  if (D == 64)
    run_decode_dim<T, 64>(p, S, stream);
  else
    run_decode_dim<T, 128>(p, S, stream);
}

}  // namespace

void run_decode(const DecodeParams& p, DType dtype, int D, int S, cudaStream_t stream) {
  if (dtype == DType::bf16)
    run_decode_typed<__nv_bfloat16>(p, D, S, stream);
  else
    run_decode_typed<__half>(p, D, S, stream);
}

}  // namespace pathattn::cuda
