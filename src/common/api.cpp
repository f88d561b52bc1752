// The public entry points: validate once at the boundary, pick a backend, call it.
#include <omp.h>

#include "common/problem.h"
#include "cpu/cpu.h"
#include "ref/ref.h"
#ifdef PATHATTN_WITH_CUDA
#include "cuda/cuda_api.h"
#endif

namespace pathattn {
namespace {

Backend resolve(const Problem& p, Backend b) {
  if (b != Backend::automatic) return b;
  if (p.device == Device::cuda) return Backend::cuda;
  return p.dtype == DType::f64 ? Backend::reference : Backend::cpu;
}

DType lse_dtype(const Problem& p) { return p.dtype == DType::f64 ? DType::f64 : DType::f32; }

void require_support(const Inputs& in, Backend b, bool backward) {
  Support s = supports(in, b, backward);
  if (!s) throw Error(std::string("pathattn: the ") + backend_name(b) + " backend does not support this case: " + s.reason);
}

}  // namespace

void check_inputs(const Inputs& in) { make_problem(in, true); }

Support supports(const Inputs& in, Backend backend, bool backward) {
  Problem p = make_problem(in, false);
  backend = resolve(p, backend);
  auto no = [](std::string why) { return Support{false, std::move(why)}; };
  switch (backend) {
    case Backend::automatic:
      break;
    case Backend::reference:
      if (p.device != Device::cpu) return no("the reference runs on CPU tensors only");
      return {};
    case Backend::cpu:
      if (p.device != Device::cpu) return no("the cpu backend runs on CPU tensors only");
      if (p.dtype != DType::f32) return no("the fast CPU path computes in float32; use Backend::reference for float64");
      if (p.D > cpu::kMaxHeadDim || p.DV > cpu::kMaxHeadDim)
        return no("head dimensions D = " + std::to_string(p.D) + ", DV = " + std::to_string(p.DV) +
                  " exceed the CPU path's maximum of " + std::to_string(cpu::kMaxHeadDim));
      return {};
    case Backend::cuda:
#ifdef PATHATTN_WITH_CUDA
      return cuda::supports(p, in, backward);
#else
      (void)backward;
      return no("this build of pathattn has no CUDA support (configure with PATHATTN_CUDA=ON)");
#endif
  }
  return {};
}

void forward(const Inputs& in, const ForwardOutputs& out, Backend backend) {
  Problem p = make_problem(in, true);
  backend = resolve(p, backend);
  require_support(in, backend, false);
  check_output(out.o, "o", {p.B, p.T, p.HQ, p.DV}, in.v.dtype, p);
  check_output(out.lse, "lse", {p.B, p.T, p.HQ}, lse_dtype(p), p);
  if (out.kcache.defined()) check_output(out.kcache, "kcache", {p.B, p.T, p.H, p.D}, in.k.dtype, p);
  switch (backend) {
    case Backend::reference: ref::forward(p, in, out); break;
    case Backend::cpu: cpu::forward(p, in, out); break;
#ifdef PATHATTN_WITH_CUDA
    case Backend::cuda: cuda::forward(p, in, out); break;
#endif
    default: throw Error("pathattn: no backend");
  }
}

void backward(const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const Gradients& grads, Backend backend) {
  Problem p = make_problem(in, true);
  backend = resolve(p, backend);
  require_support(in, backend, true);
  check_output(o, "o", {p.B, p.T, p.HQ, p.DV}, in.v.dtype, p, /*written=*/false);
  check_output(lse, "lse", {p.B, p.T, p.HQ}, lse_dtype(p), p, /*written=*/false);
  check_output(dout, "dout", {p.B, p.T, p.HQ, p.DV}, in.v.dtype, p, /*written=*/false);
  check_output(grads.dq, "dq", {p.B, p.T, p.HQ, p.D}, in.q.dtype, p);
  check_output(grads.dk, "dk", {p.B, p.T, p.H, p.D}, in.k.dtype, p);
  check_output(grads.dv, "dv", {p.B, p.T, p.H, p.DV}, in.v.dtype, p);
  check_output(grads.dw, "dw", {p.B, p.T, p.H, p.D}, in.w.dtype, p);
  check_output(grads.dbeta, "dbeta", {p.B, p.T, p.H}, in.beta.dtype, p);
  if (p.has_gate) check_output(grads.dg, "dg", {p.B, p.T, p.HQ}, in.g.dtype, p);
  switch (backend) {
    case Backend::reference: ref::backward(p, in, o, lse, dout, grads); break;
    case Backend::cpu: cpu::backward(p, in, o, lse, dout, grads); break;
#ifdef PATHATTN_WITH_CUDA
    case Backend::cuda: cuda::backward(p, in, o, lse, dout, grads); break;
#endif
    default: throw Error("pathattn: no backend");
  }
}

namespace {
int g_threads = 0;
}

int set_num_threads(int n) {
  int prev = g_threads;
  g_threads = n < 0 ? 0 : n;
  return prev;
}

// Default: OpenMP's own default, i.e. OMP_NUM_THREADS when set, else every core.
int num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  // One task runs inline: an OpenMP region for it only costs the wake-up (and, on a loaded machine, spinning
  // workers: measured 2.8 s vs 13 ms for a small torch gradient test on 2 busy cores).
  if (n <= 1) {
    if (n == 1) fn(0);
    return;
  }
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), std::max<int64_t>(n, 1)));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace pathattn
