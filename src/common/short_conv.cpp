// short_conv_w / short_conv_w_backward (pathattn.h): validate once at the boundary, then the CPU or CUDA backend.
#include "common/short_conv.h"

#include <cmath>

#include "common/checks.h"
#include "common/problem.h"

namespace pathattn {
namespace {

DType float_of(DType u) { return u == DType::f64 ? DType::f64 : DType::f32; }

Backend resolve(const ConvProblem& p, Backend b) {
  if (b == Backend::automatic || b == Backend::reference) return p.device == Device::cuda ? Backend::cuda : Backend::cpu;
  if (b == Backend::cpu && p.device != Device::cpu) fail("short_conv_w: Backend::cpu takes CPU tensors, u is on cuda");
  if (b == Backend::cuda && p.device != Device::cuda) fail("short_conv_w: Backend::cuda takes CUDA tensors, u is on cpu");
  return b;
}

void check_out(const TensorView& t, const char* name, std::initializer_list<int64_t> sizes, DType dtype,
               const TensorView& u) {
  check_view(t, name, sizes, dtype, u.device, u.device_index, "u", true);
}

}  // namespace

void set_seq_starts(ConvProblem& p, const int32_t* cu, int64_t n, int64_t stride) {
  check_cu_seqlens(cu, n, stride, p.T, " (u.size(1))");
  auto at = [&](int64_t i) { return static_cast<int64_t>(cu[i * stride]); };
  p.seq_start.assign(static_cast<std::size_t>(p.T), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = at(i); t < at(i + 1); ++t) p.seq_start[static_cast<std::size_t>(t)] = at(i);
}

ConvProblem make_conv_problem(const ShortConvW& in) {
  const TensorView& u = in.u;
  if (u.ndim != 3) fail("u must have 3 dimensions [B, T, C], got " + shape_str(u));
  ConvProblem p;
  p.B = u.sizes[0];
  p.T = u.sizes[1];
  p.C = u.sizes[2];
  p.device = u.device;
  p.device_index = u.device_index;
  if (p.B < 0 || p.T < 0 || p.C < 1) fail("u must have sizes B >= 0, T >= 0, C >= 1 in [B, T, C], got " + shape_str(u));
  if (in.head_dim < 1 || p.C % in.head_dim != 0)
    fail("head_dim must be a positive divisor of u's channels C = " + std::to_string(p.C) + ", got " +
         std::to_string(in.head_dim));
  p.D = in.head_dim;
  p.H = p.C / p.D;
  if (!(in.eps > 0) || !std::isfinite(in.eps)) fail("eps must be a finite positive number, got " + std::to_string(in.eps));
  p.eps = in.eps;
  if (u.device == Device::cpu) {
    check_dtype(u, "u", {DType::f32, DType::f64});
  } else {
    check_dtype(u, "u", {DType::f32, DType::bf16, DType::f16});
    if (p.D > 256) fail("head_dim must be at most 256 on CUDA (a warp holds a head's channels), got " + std::to_string(p.D));
  }
  check_pointer(u, "u");

  const TensorView& wt = in.weight;
  if (wt.ndim != 2 || wt.sizes[0] != p.C || wt.sizes[1] < 1)
    fail("weight must have shape [C, K] = [" + std::to_string(p.C) + ", K] with K >= 1 (u's channels C), got " +
         shape_str(wt));
  p.K = wt.sizes[1];
  if (u.device == Device::cuda && p.K > 8) fail("weight's kernel size K must be at most 8 on CUDA, got " + std::to_string(p.K));
  if (wt.dtype != float_of(u.dtype) && wt.dtype != u.dtype)
    fail(std::string("weight must have dtype ") + dtype_name(float_of(u.dtype)) + " or u's (" + dtype_name(u.dtype) +
         "), got " + dtype_name(wt.dtype));
  check_same_device(wt, "weight", u, "u");
  check_pointer(wt, "weight");

  p.has_state = in.state.defined();
  p.varlen = in.cu_seqlens.defined();
  if (p.has_state) {
    if (p.varlen) fail("state and cu_seqlens cannot both be given (a packed batch's sequences start from zeros)");
    check_shape(in.state, "state", "[B, K - 1, C]", {p.B, p.K - 1, p.C});
    if (in.state.dtype != u.dtype)
      fail(std::string("state must have u's dtype (") + dtype_name(u.dtype) + "), got " + dtype_name(in.state.dtype));
    check_same_device(in.state, "state", u, "u");
    check_pointer(in.state, "state");
  }
  if (p.varlen) {
    const TensorView& cu = in.cu_seqlens;
    if (cu.ndim != 1 || cu.sizes[0] < 2) fail("cu_seqlens must be a 1-D tensor [N + 1] with N >= 1, got shape " + shape_str(cu));
    check_dtype(cu, "cu_seqlens", {DType::i32});
    check_same_device(cu, "cu_seqlens", u, "u");
    check_pointer(cu, "cu_seqlens");
    if (p.B != 1) fail("cu_seqlens (packed varlen batch) requires B == 1, got B = " + std::to_string(p.B));
    if (cu.device == Device::cpu)
      set_seq_starts(p, static_cast<const int32_t*>(cu.data), cu.sizes[0] - 1, cu.strides[0]);
  }
  return p;
}

void short_conv_w(const ShortConvW& in, const TensorView& w, Backend backend) {
  ConvProblem p = make_conv_problem(in);
  check_out(w, "w", {p.B, p.T, p.H, p.D}, float_of(in.u.dtype), in.u);
  check_disjoint({{&w, "w"}}, {{&in.u, "u"}, {&in.weight, "weight"}, {&in.state, "state"}});
  if (resolve(p, backend) == Backend::cpu) return cpu::short_conv_w(p, in, w);
#ifdef PATHATTN_WITH_CUDA
  cuda::short_conv_w(p, in, w);
#else
  fail("this build of pathattn has no CUDA support (configure with PATHATTN_CUDA=ON)");
#endif
}

void short_conv_w_backward(const ShortConvW& in, const TensorView& dw, const TensorView& du,
                           const TensorView& dweight, const TensorView& dstate, Backend backend) {
  ConvProblem p = make_conv_problem(in);
  const DType f = float_of(in.u.dtype);
  check_view(dw, "dw", {p.B, p.T, p.H, p.D}, f, in.u.device, in.u.device_index, "u", false);
  check_out(du, "du", {p.B, p.T, p.C}, in.u.dtype, in.u);
  check_out(dweight, "dweight", {p.C, p.K}, f, in.u);
  if (dstate.defined()) {
    if (!p.has_state) fail("dstate was given but state was not (the gradient of an absent state)");
    check_out(dstate, "dstate", {p.B, p.K - 1, p.C}, in.u.dtype, in.u);
  }
  check_disjoint({{&du, "du"}, {&dweight, "dweight"}, {&dstate, "dstate"}},
                 {{&in.u, "u"}, {&in.weight, "weight"}, {&in.state, "state"}, {&dw, "dw"}});
  if (resolve(p, backend) == Backend::cpu) return cpu::short_conv_w_backward(p, in, dw, du, dweight, dstate);
#ifdef PATHATTN_WITH_CUDA
  cuda::short_conv_w_backward(p, in, dw, du, dweight, dstate);
#else
  fail("this build of pathattn has no CUDA support (configure with PATHATTN_CUDA=ON)");
#endif
}

}  // namespace pathattn
