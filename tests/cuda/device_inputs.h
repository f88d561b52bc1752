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

// The cases every CUDA op is tested on (forward and backward add their own): both dtypes and head dimensions,
// lengths around the chunk size C = 64 and across many chunks, GQA with the gate, varlen with length-1 sequences.
inline std::vector<GpuSpec> core_cases() {
  std::vector<GpuSpec> c;
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128}) {
      for (int64_t T : {1, 2, 63, 64, 65, 200, 1000})
        c.push_back({{.B = T >= 1000 ? 1 : 2, .T = T, .H = 2, .HQ = 2, .D = D, .DV = D, .seed = 11 + uint64_t(T)}, dt});
      for (int64_t T : {65, 200})  // GQA (HQ / H = 4) with the gate
        c.push_back({{.B = 1, .T = T, .H = 1, .HQ = 4, .D = D, .DV = D, .gate = true, .seed = 3}, dt});
      // Varlen: length-1 sequences and sequences that straddle chunk boundaries of the packed tensor.
      c.push_back({{.B = 1, .T = 331, .H = 2, .HQ = 4, .D = D, .DV = D, .gate = dt == DType::bf16,
                    .seqlens = {1, 63, 1, 130, 64, 65, 7}, .seed = 5}, dt});
    }
  return c;
}

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
