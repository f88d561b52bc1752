// A GPU test case (a harness Spec plus the dtypes and layouts the kernels are given) and its inputs on the device,
// uploaded as a user would pass them: q, k, v (and dO) in bf16 / f16, w in f32 or bf16, beta and g in f32.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "harness.h"

namespace pathattn::test {

struct GpuSpec {
  Spec s;
  DType dt = DType::bf16;
  bool w_lowp = false;    // pass w in bf16 instead of f32
  bool w_padded = false;  // w rows padded by one element: strides that rule out 16-byte loads (scalar path)
  bool dlse = false;      // backward: the loss uses lse too (dlse given)
  std::string name() const {
    return s.name() + (dt == DType::bf16 ? "_bf16" : "_f16") + (w_lowp ? "_wbf16" : "") + (w_padded ? "_wpad" : "") +
           (dlse ? "_dlse" : "");
  }
};

// gtest prints a failing case's parameter with this (instead of its bytes).
inline void PrintTo(const GpuSpec& g, std::ostream* os) { *os << g.name() << "_seed" << g.s.seed; }

// The inputs of P on the device (permuted views when the spec says so) and the Inputs that point at them.
struct DevInputs {
  DevTensor q, k, v, w, beta;
  std::unique_ptr<DevTensor> g, cu;
  Inputs in;
  DevInputs(const Problem64& P, const GpuSpec& gs)
      : q(P.q, {gs.s.B, gs.s.T, gs.s.HQ, gs.s.D}, gs.dt, gs.s.permuted),
        k(P.k, {gs.s.B, gs.s.T, gs.s.H, gs.s.D}, gs.dt, gs.s.permuted),
        v(P.v, {gs.s.B, gs.s.T, gs.s.H, gs.s.DV}, gs.dt, gs.s.permuted),
        w(P.w, {gs.s.B, gs.s.T, gs.s.H, gs.s.D}, gs.w_lowp ? DType::bf16 : DType::f32, gs.s.permuted,
          gs.w_padded ? 1 : 0),
        beta(P.beta, {gs.s.B, gs.s.T, gs.s.H}, DType::f32, gs.s.permuted) {
    const Spec& s = gs.s;
    in.q = q.view;
    in.k = k.view;
    in.v = v.view;
    in.w = w.view;
    in.beta = beta.view;
    if (s.gate) {
      g = std::make_unique<DevTensor>(P.g, std::vector<int64_t>{s.B, s.T, s.HQ}, DType::f32, s.permuted);
      in.g = g->view;
    }
    if (!P.cu.empty()) {
      cu = std::make_unique<DevTensor>(std::vector<double>(P.cu.begin(), P.cu.end()),
                                       std::vector<int64_t>{int64_t(P.cu.size())}, DType::i32, false);
      in.cu_seqlens = cu->view;
    }
  }
};

}  // namespace pathattn::test
