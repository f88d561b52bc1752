// rope_rotate (pathattn.h): validate once at the boundary, then the CPU or CUDA backend.
#include "common/rope.h"

#include <cstdint>
#include <string>

#include "common/checks.h"
#include "common/problem.h"

namespace pathattn {

void rope_rotate(const RopeRotate& in, const TensorView& out, Backend backend) {
  const TensorView& x = in.x;
  if (x.ndim != 4) fail("x must have 4 dimensions [B, T, H, D], got " + shape_str(x));
  check_pointer(x, "x");
  if (x.device == Device::cuda)
    check_dtype(x, "x", {DType::f32, DType::bf16, DType::f16});
  else  // the CPU paths' dtypes (the model's CPU RoPE stays composed)
    check_dtype(x, "x", {DType::f32, DType::f64});
  RopeProblem p{x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]};
  if (p.B * p.T > INT32_MAX || p.H * p.D > INT32_MAX)
    fail("x: B * T and H * D must each be below 2^31 (the kernel's 32-bit indices), got " + shape_str(x));
  if (p.D % 2 != 0 || p.D == 0) fail("x: the head dimension D = x.size(3) must be even and positive, got " + shape_str(x));
  if (x.strides[3] != 1) fail("x: rows of D must be contiguous (x.stride(3) == 1), got stride " + std::to_string(x.strides[3]));
  const DType f = x.dtype == DType::f64 ? DType::f64 : DType::f32;
  for (const TensorView* t : {&in.cos, &in.sin}) {
    const char* name = t == &in.cos ? "cos" : "sin";
    check_view(*t, name, {p.T, p.D / 2}, f, x.device, x.device_index, "x", false);
    if (t->strides[1] != 1 || t->strides[0] != p.D / 2)
      fail(std::string(name) + ": expected a contiguous [T, D / 2] table, got strides [" +
           std::to_string(t->strides[0]) + ", " + std::to_string(t->strides[1]) + "]");
  }
  check_view(out, "out", {p.B, p.T, p.H, p.D}, x.dtype, x.device, x.device_index, "x", true);
  if (out.strides[3] != 1) fail("out: rows of D must be contiguous (out.stride(3) == 1)");
  check_disjoint({{&out, "out"}}, {{&x, "x"}, {&in.cos, "cos"}, {&in.sin, "sin"}});
  if (p.B * p.T * p.H == 0) return;
  Backend b = backend;
  if (b == Backend::automatic || b == Backend::reference) b = x.device == Device::cuda ? Backend::cuda : Backend::cpu;
  if (b == Backend::cpu && x.device != Device::cpu) fail("rope_rotate: Backend::cpu takes CPU tensors, x is on cuda");
  if (b == Backend::cuda && x.device != Device::cuda) fail("rope_rotate: Backend::cuda takes CUDA tensors, x is on cpu");
  if (b == Backend::cpu) return cpu::rope_rotate(p, in, out);
#ifdef PATHATTN_WITH_CUDA
  cuda::rope_rotate(p, in, out);
#else
  fail("this build of pathattn has no CUDA support (configure with PATHATTN_CUDA=ON)");
#endif
}

}  // namespace pathattn
