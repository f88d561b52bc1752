// The public entry points: validate once at the boundary, pick a backend, call it.
#include <cstdlib>
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

const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "forward";
    case Op::backward: return "backward";
    case Op::decode: return "decode";
  }
  return "?";
}

Support supports(const Inputs& in, Backend backend, bool backward) {
  return supports(in, backend, backward ? Op::backward : Op::forward);
}

Support supports(const Inputs& in, Backend backend, Op op) {
  Problem p = make_problem(in, false);
  backend = resolve(p, backend);
  auto no = [](std::string why) { return Support{false, std::move(why)}; };
  if (op == Op::decode) {
    if (in.cu_seqlens.defined())
      return no("decode takes no cu_seqlens: the cache holds B sequences with their own lengths");
    if (backend == Backend::cuda && p.device == Device::cuda) {
#ifdef PATHATTN_WITH_CUDA
      return cuda::supports_decode(p, in);
#else
      return no("this build of pathattn has no CUDA support (configure with PATHATTN_CUDA=ON)");
#endif
    }
    if (backend != Backend::cpu || p.device != Device::cpu || p.dtype != DType::f32)
      return no(std::string("decode runs on CPU float32 tensors with Backend::cpu or on CUDA tensors with ") +
                "Backend::cuda, got " + dtype_name(p.dtype) + " on " + (p.device == Device::cuda ? "cuda" : "cpu") +
                " with Backend::" + backend_name(backend));
  }
  const bool backward = op == Op::backward;
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

// The read views of the inputs, named, for check_disjoint; `more` appended.
static std::vector<Named> inputs_of(const Inputs& in, std::initializer_list<Named> more = {}) {
  std::vector<Named> r{{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&in.w, "w"}, {&in.beta, "beta"}, {&in.g, "g"},
                       {&in.cu_seqlens, "cu_seqlens"}};
  r.insert(r.end(), more.begin(), more.end());
  return r;
}

void forward(const Inputs& in, const ForwardOutputs& out, Backend backend) {
  Problem p = make_problem(in, true);
  backend = resolve(p, backend);
  require_support(in, backend, false);
  check_output(out.o, "o", {p.B, p.T, p.HQ, p.DV}, in.v.dtype, p);
  check_output(out.lse, "lse", {p.B, p.T, p.HQ}, lse_dtype(p), p);
  if (out.kcache.defined()) check_output(out.kcache, "kcache", {p.B, p.T, p.H, p.D}, in.k.dtype, p);
  check_disjoint({{&out.o, "o"}, {&out.lse, "lse"}, {&out.kcache, "kcache"}}, inputs_of(in));
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
  backward(in, o, lse, dout, TensorView{}, grads, backend);
}

void backward(const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const TensorView& dlse, const Gradients& grads, Backend backend) {
  Problem p = make_problem(in, true);
  backend = resolve(p, backend);
  require_support(in, backend, true);
  check_output(o, "o", {p.B, p.T, p.HQ, p.DV}, in.v.dtype, p, /*written=*/false);
  check_output(lse, "lse", {p.B, p.T, p.HQ}, lse_dtype(p), p, /*written=*/false);
  check_output(dout, "dout", {p.B, p.T, p.HQ, p.DV}, in.v.dtype, p, /*written=*/false);
  if (dlse.defined()) check_output(dlse, "dlse", {p.B, p.T, p.HQ}, lse_dtype(p), p, /*written=*/false);
  check_output(grads.dq, "dq", {p.B, p.T, p.HQ, p.D}, in.q.dtype, p);
  check_output(grads.dk, "dk", {p.B, p.T, p.H, p.D}, in.k.dtype, p);
  check_output(grads.dv, "dv", {p.B, p.T, p.H, p.DV}, in.v.dtype, p);
  check_output(grads.dw, "dw", {p.B, p.T, p.H, p.D}, in.w.dtype, p);
  check_output(grads.dbeta, "dbeta", {p.B, p.T, p.H}, in.beta.dtype, p);
  if (p.has_gate) check_output(grads.dg, "dg", {p.B, p.T, p.HQ}, in.g.dtype, p);
  check_disjoint({{&grads.dq, "dq"}, {&grads.dk, "dk"}, {&grads.dv, "dv"}, {&grads.dw, "dw"}, {&grads.dbeta, "dbeta"},
                  {&grads.dg, "dg"}},
                 inputs_of(in, {{&o, "o"}, {&lse, "lse"}, {&dout, "dout"}, {&dlse, "dlse"}}));
  switch (backend) {
    case Backend::reference: ref::backward(p, in, o, lse, dout, dlse, grads); break;
    case Backend::cpu: cpu::backward(p, in, o, lse, dout, dlse, grads); break;
#ifdef PATHATTN_WITH_CUDA
    case Backend::cuda: cuda::backward(p, in, o, lse, dout, dlse, grads); break;
#endif
    default: throw Error("pathattn: no backend");
  }
}

namespace {

// The checkpointed cache's tensors (pathattn.h, DecodeCache): both or neither, their shapes, the period, and on the
// CPU the invariant 0 <= lengths[b] - ckpt[b] < P, which the decode keeps.
void check_checkpoint(const Problem& p, const DecodeCache& cache, int64_t Tmax) {
  if (!cache.ckpt.defined() || !cache.carry.defined())
    throw Error("pathattn: a checkpointed cache needs both cache.ckpt and cache.carry");
  const int64_t P = cache.ckpt_period;
  if (P < 1) throw Error("pathattn: cache.ckpt_period must be >= 1 with a checkpointed cache, got " + std::to_string(P));
  const TensorView& c = cache.ckpt;
  if (c.ndim != 1 || c.sizes[0] != p.B || c.dtype != DType::i32 || c.device != p.device ||
      c.device_index != p.device_index || !c.data)
    throw Error("pathattn: cache.ckpt must be an int32 tensor [B] = [" + std::to_string(p.B) + "] on " +
                (p.device == Device::cuda ? "q's CUDA device" : "the CPU"));
  check_output(cache.carry, "cache.carry", {p.B, p.H, p.D, p.D}, DType::f32, p);
  // On CUDA ckpt lives on the device (not read here): a cache that breaks the invariant gets NaN, as one without room.
  for (int64_t b = 0; p.device == Device::cpu && b < p.B; ++b) {
    const int64_t ck = static_cast<const int32_t*>(c.data)[b * c.strides[0]];
    const int64_t len = static_cast<const int32_t*>(cache.lengths.data)[b * cache.lengths.strides[0]];
    if (ck < 0 || ck > len || len - ck >= P || ck > Tmax)
      throw Error("pathattn: cache.ckpt[" + std::to_string(b) + "] = " + std::to_string(ck) +
                  " must be in [lengths - P + 1, lengths] = [" + std::to_string(len - P + 1) + ", " +
                  std::to_string(len) + "] (P = ckpt_period = " + std::to_string(P) + ")");
  }
}

}  // namespace

void decode(const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out, Backend backend, bool commit) {
  if (in.cu_seqlens.defined())  // before make_problem, which would take it as a packed batch
    throw Error("pathattn: decode takes no cu_seqlens: the cache holds B sequences with their own lengths");
  Problem p = make_problem(in, true);
  backend = resolve(p, backend);
  if (Support s = supports(in, backend, Op::decode); !s) throw Error("pathattn: " + s.reason);
  if (cache.k.ndim != 4) throw Error("pathattn: cache.k must have 4 dimensions [B, Tmax, H, D], got " + std::to_string(cache.k.ndim));
  const int64_t Tmax = cache.k.sizes[1];
  // The cache's dtypes: f32 everywhere; on CUDA also keys in bf16 (rounded at every carry: docs/cuda.md "Decode"
  // measures the drift) and values in v's dtype (never carried, so exact: they are the inputs' own values).
  const bool cuda = p.device == Device::cuda;
  if (cache.k.dtype != DType::f32 && !(cuda && cache.k.dtype == DType::bf16))
    throw Error(std::string("pathattn: cache.k must have dtype float32") + (cuda ? " or bfloat16" : " (the CPU decode)") +
                ", got " + dtype_name(cache.k.dtype));
  if (cache.v.dtype != DType::f32 && !(cuda && cache.v.dtype == in.v.dtype))
    throw Error(std::string("pathattn: cache.v must have dtype float32") +
                (cuda ? std::string(" or v's dtype (") + dtype_name(in.v.dtype) + ")" : std::string(" (the CPU decode)")) +
                ", got " + dtype_name(cache.v.dtype));
  check_output(cache.k, "cache.k", {p.B, Tmax, p.H, p.D}, cache.k.dtype, p);
  check_output(cache.v, "cache.v", {p.B, Tmax, p.H, p.DV}, cache.v.dtype, p);
  if (p.has_gate) {
    if (!cache.gcum.defined()) throw Error("pathattn: cache.gcum [B, Tmax, HQ] is required when g is given");
    if (cache.gcum.dtype != DType::f32 && cache.gcum.dtype != DType::f64)
      throw Error(std::string("pathattn: cache.gcum must have dtype float32 or float64, got ") + dtype_name(cache.gcum.dtype));
    check_output(cache.gcum, "cache.gcum", {p.B, Tmax, p.HQ}, cache.gcum.dtype, p);
  }
  // lengths lives with the cache: on the CPU for the CPU op; on q's CUDA device for the CUDA op, which reads and
  // advances it in its kernels (so no host work depends on it), where a sequence that does not fit gets NaN outputs
  // instead of this check.
  const TensorView& len = cache.lengths;
  if (len.ndim != 1 || len.sizes[0] != p.B || len.dtype != DType::i32 || len.device != p.device ||
      len.device_index != p.device_index || !len.data)
    throw Error("pathattn: cache.lengths must be " +
                std::string(p.device == Device::cuda ? "an int32 tensor on q's CUDA device" : "a CPU int32 tensor") +
                " [B] = [" + std::to_string(p.B) + "]");
  for (int64_t b = 0; p.device == Device::cpu && b < p.B; ++b) {
    const int64_t l = static_cast<const int32_t*>(len.data)[b * len.strides[0]];
    if (l < 0 || l + p.T > Tmax)
      throw Error("pathattn: cache.lengths[" + std::to_string(b) + "] = " + std::to_string(l) + " plus the " +
                  std::to_string(p.T) + " new tokens must fit the cache's Tmax = " + std::to_string(Tmax));
  }
  const bool checkpointed = cache.ckpt.defined() || cache.carry.defined();
  if (checkpointed) check_checkpoint(p, cache, Tmax);
  if (!commit && checkpointed)
    throw Error("pathattn: decode with commit = false takes the plain cache, not a checkpointed one (cache.ckpt)");
  check_output(out.o, "o", {p.B, p.T, p.HQ, p.DV}, in.v.dtype, p);
  check_output(out.lse, "lse", {p.B, p.T, p.HQ}, lse_dtype(p), p);
  // The cache is read and written in place: it must not alias the new tokens' inputs or the outputs either.
  check_disjoint({{&out.o, "o"}, {&out.lse, "lse"}, {&cache.k, "cache.k"}, {&cache.v, "cache.v"},
                  {&cache.gcum, "cache.gcum"}, {&cache.ckpt, "cache.ckpt"}, {&cache.carry, "cache.carry"}},
                 inputs_of(in, {{&cache.lengths, "cache.lengths"}}));
  switch (backend) {
    case Backend::cpu:
      if (checkpointed)
        cpu::decode_checkpointed(p, in, cache, out);
      else
        cpu::decode(p, in, cache, out, commit);
      break;
#ifdef PATHATTN_WITH_CUDA
    case Backend::cuda: cuda::decode(p, in, cache, out, commit); break;
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
