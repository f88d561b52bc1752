// Plain causal softmax attention (with the forget gate when the spec has one) in f64, forward and backward written
// out directly, no Householder anywhere: what PaTH must reduce to when every beta is 0 (H_t = I). An oracle that
// shares no code with the recurrence (tests/recurrence.h) or the reference (src/ref).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "harness.h"

namespace pathattn::test {

struct SoftmaxAttention {
  std::vector<double> o, lse;       // [B, T, HQ, DV], [B, T, HQ]
  std::vector<double> dq, dk, dv;   // [B, T, HQ, D], [B, T, H, D], [B, T, H, DV]
  std::vector<double> dg;           // [B, T, HQ], empty without a gate
};

// The loss is sum(dout * o) + sum(dlse * lse) (dlse empty: zero), as pathattn::backward's.
inline SoftmaxAttention softmax_attention(const Problem64& P, const std::vector<double>& dout,
                                          const std::vector<double>& dlse) {
  const Spec& s = P.spec;
  const int64_t D = s.D, DV = s.DV, G = s.HQ / s.H;
  const double scale = 1.0 / std::sqrt(double(D));
  SoftmaxAttention r;
  r.o.assign(s.B * s.T * s.HQ * DV, 0.0);
  r.lse.assign(s.B * s.T * s.HQ, 0.0);
  r.dq.assign(s.B * s.T * s.HQ * D, 0.0);
  r.dk.assign(s.B * s.T * s.H * D, 0.0);
  r.dv.assign(s.B * s.T * s.H * DV, 0.0);
  std::vector<double> dG(s.B * s.T * s.HQ, 0.0);  // d loss / d G_t, G_t the cumulative gate
  std::vector<std::array<int64_t, 3>> seqs;       // (b, t0, L)
  if (P.cu.empty())
    for (int64_t b = 0; b < s.B; ++b) seqs.push_back({b, 0, s.T});
  else
    for (size_t n = 0; n + 1 < P.cu.size(); ++n) seqs.push_back({0, P.cu[n], P.cu[n + 1] - P.cu[n]});
  for (const auto& [b, t0, L] : seqs)
    for (int64_t hq = 0; hq < s.HQ; ++hq) {
      const int64_t h = hq / G;
      auto rq = [&](int64_t t) { return (b * s.T + t0 + t) * s.HQ + hq; };
      auto rk = [&](int64_t t) { return (b * s.T + t0 + t) * s.H + h; };
      std::vector<double> Gc(L, 0.0);
      for (int64_t t = 0; t < L; ++t) Gc[t] = (t > 0 ? Gc[t - 1] : 0.0) + (s.gate ? P.g[rq(t)] : 0.0);
      for (int64_t t = 0; t < L; ++t) {
        std::vector<double> p(t + 1);
        double m = -INFINITY;
        for (int64_t i = 0; i <= t; ++i) {
          double qk = 0;
          for (int64_t d = 0; d < D; ++d) qk += P.q[rq(t) * D + d] * P.k[rk(i) * D + d];
          p[i] = scale * qk + Gc[t] - Gc[i];
          m = std::max(m, p[i]);
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - m));
        for (double& x : p) x /= sum;
        r.lse[rq(t)] = m + std::log(sum);
        for (int64_t d = 0; d < DV; ++d)
          for (int64_t i = 0; i <= t; ++i) r.o[rq(t) * DV + d] += p[i] * P.v[rk(i) * DV + d];
        // Backward: dl_ti = p_ti (dO_t . v_i - dO_t . o_t + dlse_t).
        double delta = dlse.empty() ? 0.0 : -dlse[rq(t)];
        for (int64_t d = 0; d < DV; ++d) delta += dout[rq(t) * DV + d] * r.o[rq(t) * DV + d];
        for (int64_t i = 0; i <= t; ++i) {
          double dp = 0;
          for (int64_t d = 0; d < DV; ++d) dp += dout[rq(t) * DV + d] * P.v[rk(i) * DV + d];
          const double dl = p[i] * (dp - delta);
          for (int64_t d = 0; d < DV; ++d) r.dv[rk(i) * DV + d] += p[i] * dout[rq(t) * DV + d];
          for (int64_t d = 0; d < D; ++d) {
            r.dq[rq(t) * D + d] += scale * dl * P.k[rk(i) * D + d];
            r.dk[rk(i) * D + d] += scale * dl * P.q[rq(t) * D + d];
          }
          dG[rq(t)] += dl;
          dG[rq(i)] -= dl;
        }
      }
      if (s.gate) {
        r.dg.resize(s.B * s.T * s.HQ);
        double run = 0;
        for (int64_t t = L - 1; t >= 0; --t) r.dg[rq(t)] = (run += dG[rq(t)]);
      }
    }
  return r;
}

}  // namespace pathattn::test
