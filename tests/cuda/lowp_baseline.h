// "The same math done plainly in low precision": the yardstick of FlashAttention's tolerance rule for the CUDA
// forward (docs/spec.md §6, tests/tolerances.h kLowPrecisionFactor). A CUDA result passes when its error against
// the f64 reference is at most kLowPrecisionFactor times this baseline's error plus kLowPrecisionAbs.
//
// The baseline is the key-cache recurrence (docs/math.md Eq. 3, 4) as a plain bf16 / f16 decoder would run it:
//   - q, k, v rounded to the low precision, and w to bf16 when the kernel is given w in bf16: the kernel's inputs
//     (w is f32 or bf16 even when q is f16: the first version rounded it to q's dtype, which a case with f16 q and
//     bf16 w exposed as a baseline too precise for the kernel's actual input);
//   - the cache kept in f32 and updated in f32 (beta, w, the Householder step: f32, as docs/spec.md §6 keeps them);
//   - each logit a dot product of low-precision operands (q_t and the cached key rounded when used) with f32
//     accumulation, the gate sum G in f64 (no extra error from it);
//   - softmax in f32, the probabilities rounded to low precision before P V (f32 accumulation), o rounded;
//   - lse in f32; the key cache rounded once at the end.
// Every rounding here is one the tensor-core kernel also makes (operands of each product in low precision,
// f32 accumulation), which is what "plainly" means in FlashAttention's rule. The kernel additionally rounds its
// running query Q~ and the chunk factors U, W, M to low precision as product operands; the factor 2 is the
// allowance for those.
//
// The backward's baseline is tests/recurrence.h (same rounding rules, with the reverse sweep).
#pragma once

#include <cmath>
#include <vector>

#include "harness.h"
#include "lowp_round.h"  // round_to: equal to the CUDA conversions (test_cuda_backward checks it)

namespace pathattn::test {

struct LowpResult {
  std::vector<double> o, lse, kcache;  // [B, T, HQ, DV], [B, T, HQ], [B, T, H, D]
};

inline LowpResult lowp_forward(const Problem64& P, DType dt, bool w_lowp) {
  const Spec& s = P.spec;
  const int64_t D = s.D, DV = s.DV, G = s.HQ / s.H;
  LowpResult r;
  r.o.assign(s.B * s.T * s.HQ * DV, 0.0);
  r.lse.assign(s.B * s.T * s.HQ, 0.0);
  r.kcache.assign(s.B * s.T * s.H * D, 0.0);
  std::vector<int64_t> bs, t0s, lens;
  if (!P.cu.empty()) {
    for (size_t n = 0; n + 1 < P.cu.size(); ++n) {
      bs.push_back(0);
      t0s.push_back(P.cu[n]);
      lens.push_back(P.cu[n + 1] - P.cu[n]);
    }
  } else {
    for (int64_t b = 0; b < s.B; ++b) {
      bs.push_back(b);
      t0s.push_back(0);
      lens.push_back(s.T);
    }
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  for (size_t n = 0; n < bs.size(); ++n)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t b = bs[n], t0 = t0s[n], L = lens[n];
      auto row = [&](int64_t t, int64_t heads, int64_t hh, int64_t dim) { return ((b * s.T + t0 + t) * heads + hh) * dim; };
      std::vector<float> cache(L * D), wt(D), qt(D), l, kr(L * D);
      std::vector<double> Gc(G * L, 0.0);
      if (s.gate)
        for (int64_t j = 0; j < G; ++j) {
          double acc = 0;
          for (int64_t t = 0; t < L; ++t) Gc[j * L + t] = (acc += P.g[(b * s.T + t0 + t) * s.HQ + h * G + j]);
        }
      for (int64_t t = 0; t < L; ++t) {
        // Eq. 3 in f32: cache <- H_t cache, then append k_t.
        for (int64_t d = 0; d < D; ++d) {
          const float w = static_cast<float>(P.w[row(t, s.H, h, D) + d]);
          wt[d] = w_lowp ? round_to(w, DType::bf16) : w;  // the kernel's w input: bf16 whatever q's dtype
        }
        const float bt = static_cast<float>(P.beta[(b * s.T + t0 + t) * s.H + h]);
        if (t > 0)
          for (int64_t j = 0; j < t; ++j) {
            float a = 0.f;
            for (int64_t d = 0; d < D; ++d) a += cache[j * D + d] * wt[d];
            a *= bt;
            for (int64_t d = 0; d < D; ++d) cache[j * D + d] -= a * wt[d];
          }
        for (int64_t d = 0; d < D; ++d) cache[t * D + d] = round_to(static_cast<float>(P.k[row(t, s.H, h, D) + d]), dt);
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t d = 0; d < D; ++d) kr[j * D + d] = round_to(cache[j * D + d], dt);
        for (int64_t jq = 0; jq < G; ++jq) {
          const int64_t hq = h * G + jq;
          for (int64_t d = 0; d < D; ++d) qt[d] = round_to(static_cast<float>(P.q[row(t, s.HQ, hq, D) + d]), dt);
          l.assign(t + 1, 0.f);
          float m = -INFINITY;
          for (int64_t j = 0; j <= t; ++j) {
            float acc = 0.f;
            for (int64_t d = 0; d < D; ++d) acc += qt[d] * kr[j * D + d];
            l[j] = scale * acc + (s.gate ? static_cast<float>(Gc[jq * L + t] - Gc[jq * L + j]) : 0.f);
            m = std::max(m, l[j]);
          }
          float sum = 0.f;
          for (float& x : l) {
            x = std::exp(x - m);
            sum += x;
          }
          for (int64_t d = 0; d < DV; ++d) {
            float acc = 0.f;
            for (int64_t j = 0; j <= t; ++j)
              acc += round_to(l[j], dt) * round_to(static_cast<float>(P.v[row(j, s.H, h, DV) + d]), dt);
            r.o[row(t, s.HQ, hq, DV) + d] = round_to(acc / sum, dt);
          }
          r.lse[(b * s.T + t0 + t) * s.HQ + hq] = m + std::log(sum);
        }
      }
      for (int64_t t = 0; t < L; ++t)
        for (int64_t d = 0; d < D; ++d) r.kcache[row(t, s.H, h, D) + d] = round_to(cache[t * D + d], dt);
    }
  return r;
}

}  // namespace pathattn::test
