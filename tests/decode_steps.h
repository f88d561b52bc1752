// Decoding a sequence in steps through pathattn::decode: views of rows [t0, t0 + S), a caller-owned f32 cache, and
// the loop that feeds a problem's sequence step by step. Shared by tests/test_decode.cpp and tests/test_backend_ops.cpp.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "harness.h"

namespace pathattn::test {

// Rows [t0, t0 + S) of a [B, T, ...] view.
inline TensorView rows(const TensorView& t, int64_t t0, int64_t S) {
  TensorView r = t;
  r.data = static_cast<char*>(t.data) + t0 * t.strides[1] * static_cast<int64_t>(dtype_size(t.dtype));
  r.sizes[1] = S;
  return r;
}

inline Inputs step_inputs(const Inputs& in, int64_t t0, int64_t S) {
  Inputs s = in;
  s.q = rows(in.q, t0, S);
  s.k = rows(in.k, t0, S);
  s.v = rows(in.v, t0, S);
  s.w = rows(in.w, t0, S);
  s.beta = rows(in.beta, t0, S);
  if (in.g.defined()) s.g = rows(in.g, t0, S);
  return s;
}

struct DecodeState {
  Buffer<float> k, v;
  Buffer<double> gcum;
  Buffer<int32_t> lengths;
  DecodeState(const Spec& s, int64_t Tmax)
      : k({s.B, Tmax, s.H, s.D}, DType::f32),
        v({s.B, Tmax, s.H, s.DV}, DType::f32),
        gcum({s.B, Tmax, s.HQ}, DType::f64),
        lengths({s.B}, DType::i32) {
    for (int64_t b = 0; b < s.B; ++b) lengths.data()[b] = 0;
  }
  DecodeCache view(bool gate) {
    DecodeCache c{k.view, v.view, {}, lengths.view};
    if (gate) c.gcum = gcum.view;
    return c;
  }
};

// A checkpointed cache's keys as the plain cache holds them (docs/math.md Eq. 36): for each sequence with tokens
// pending (lengths[b] > ckpt[b]), rows [0, ckpt[b]) of k [B, Tmax, H, D] carried by carry [B, H, D, D],
// row <- carry^T row, in f64; without pending tokens the carry is ignored. Shared by the CPU and GPU decode tests.
inline std::vector<double> materialized_keys(std::vector<double> k, int64_t Tmax, int64_t H, int64_t D,
                                             const std::vector<double>& ckpt, const std::vector<double>& lengths,
                                             const std::vector<double>& carry) {
  for (size_t b = 0; b < ckpt.size(); ++b) {
    if (lengths[b] == ckpt[b]) continue;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < static_cast<int64_t>(ckpt[b]); ++j) {
        double* row = &k[((b * Tmax + j) * H + h) * D];
        std::vector<double> r(D, 0.0);
        for (int64_t e = 0; e < D; ++e)
          for (int64_t d = 0; d < D; ++d) r[e] += carry[((b * H + h) * D + d) * D + e] * row[d];
        for (int64_t e = 0; e < D; ++e) row[e] = r[e];
      }
  }
  return k;
}

// Decodes the whole sequence of `c` in steps of the given sizes (from `start`, with the cache already holding
// rows [0, start)), writing each step's o and lse into the full-size buffers.
inline void decode_in_steps(Case<float>& c, DecodeState& cache, int64_t start, const std::vector<int64_t>& steps,
                            Buffer<float>& o, Buffer<float>& lse) {
  int64_t t0 = start;
  for (int64_t S : steps) {
    ForwardOutputs out{rows(o.view, t0, S), rows(lse.view, t0, S), {}};
    decode(step_inputs(c.in, t0, S), cache.view(c.P.spec.gate), out, Backend::cpu);
    t0 += S;
  }
  ASSERT_EQ(t0, c.P.spec.T) << "the step sizes must cover the sequence";
}

}  // namespace pathattn::test
