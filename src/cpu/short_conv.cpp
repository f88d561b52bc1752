// The fused short convolution of w on the CPU (docs/math.md Eq. 44-46), f32 or f64 views, in double arithmetic:
// the readable statement of what the CUDA kernels (src/cuda/kernels/short_conv.cuh) compute. Parallel over heads,
// so that each thread owns its heads' channels of dweight and every sum runs in one fixed order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/problem.h"
#include "common/short_conv.h"

namespace pathattn::cpu {
namespace {

// The convolution's input at position s (may be negative: the state) for output row t of batch row b, channel c:
// u, the state before row 0, or zero before t's sequence start (Eq. 44).
double conv_input(const ConvProblem& p, const ShortConvW& in, int64_t b, int64_t t, int64_t s, int64_t c) {
  const int64_t start = p.varlen ? p.seq_start[static_cast<std::size_t>(t)] : 0;
  if (s >= start) return load(in.u, offset(in.u, b, s, c));
  if (p.has_state && s < 0) return load(in.state, offset(in.state, b, p.K - 1 + s, c));
  return 0.0;
}

double weight_at(const ShortConvW& in, int64_t c, int64_t j) { return load(in.weight, offset(in.weight, c, j)); }

// y (before SiLU) of row t, channels [c0, c0 + D).
void conv_row(const ConvProblem& p, const ShortConvW& in, int64_t b, int64_t t, int64_t c0, std::vector<double>& y) {
  for (int64_t d = 0; d < p.D; ++d) {
    double acc = 0.0;
    for (int64_t j = 0; j < p.K; ++j) acc += weight_at(in, c0 + d, j) * conv_input(p, in, b, t, t - p.K + 1 + j, c0 + d);
    y[static_cast<std::size_t>(d)] = acc;
  }
}

double sigmoid(double y) { return 1.0 / (1.0 + std::exp(-y)); }

}  // namespace

void short_conv_w(const ConvProblem& p, const ShortConvW& in, const TensorView& w) {
  parallel_for(p.B * p.H, [&](int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H, c0 = h * p.D;
    std::vector<double> y(static_cast<std::size_t>(p.D));
    for (int64_t t = 0; t < p.T; ++t) {
      conv_row(p, in, b, t, c0, y);
      double ss = 0.0;
      for (double& a : y) {
        a *= sigmoid(a);  // a = silu(y)
        ss += a * a;
      }
      const double n = std::max(std::sqrt(ss), p.eps);  // Eq. 45
      for (int64_t d = 0; d < p.D; ++d) store(w, offset(w, b, t, h, d), y[static_cast<std::size_t>(d)] / n);
    }
  });
}

void short_conv_w_backward(const ConvProblem& p, const ShortConvW& in, const TensorView& dw, const TensorView& du,
                           const TensorView& dweight, const TensorView& dstate) {
  parallel_for(p.H, [&](int64_t h) {
    const int64_t c0 = h * p.D, D = p.D, K = p.K;
    std::vector<double> y(static_cast<std::size_t>(D)), a(static_cast<std::size_t>(D));
    std::vector<double> dy(static_cast<std::size_t>(p.T * D));  // one batch row's dL/dy, [T, D]
    std::vector<double> dwt(static_cast<std::size_t>(D * K), 0.0);
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t t = 0; t < p.T; ++t) {
        conv_row(p, in, b, t, c0, y);
        double ss = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          a[d] = y[d] * sigmoid(y[d]);
          ss += a[d] * a[d];
        }
        const double norm = std::sqrt(ss);
        const double n = std::max(norm, p.eps);
        // Eq. 46: da = (dw - w (w . dw)) / n where the norm is not clamped (F.normalize's clamp_min passes the
        // gradient at equality), dw / eps where it is.
        double wdw = 0.0;
        for (int64_t d = 0; d < D; ++d) wdw += a[d] / n * load(dw, offset(dw, b, t, h, d));
        for (int64_t d = 0; d < D; ++d) {
          const double g = load(dw, offset(dw, b, t, h, d));
          const double da = norm >= p.eps ? (g - a[d] / n * wdw) / n : g / p.eps;
          const double s = sigmoid(y[d]);
          dy[static_cast<std::size_t>(t * D + d)] = da * s * (1.0 + y[d] * (1.0 - s));  // silu'(y)
        }
      }
      // dweight[c, j] += sum_t dy[t, c] x(t - K + 1 + j); du[s] = sum_j weight[c, j] dy[s + K - 1 - j] over the
      // rows t = s + K - 1 - j of s's own sequence (for s < 0: dstate).
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t d = 0; d < D; ++d)
          for (int64_t j = 0; j < K; ++j)
            dwt[static_cast<std::size_t>(d * K + j)] +=
                dy[static_cast<std::size_t>(t * D + d)] * conv_input(p, in, b, t, t - K + 1 + j, c0 + d);
      const int64_t s_first = dstate.defined() ? -(K - 1) : 0;
      for (int64_t s = s_first; s < p.T; ++s) {
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < K; ++j) {
            const int64_t t = s + K - 1 - j;
            if (t < 0 || t >= p.T) continue;
            if (p.varlen && p.seq_start[static_cast<std::size_t>(t)] > s) continue;  // t starts after s's sequence
            acc += weight_at(in, c0 + d, j) * dy[static_cast<std::size_t>(t * D + d)];
          }
          if (s >= 0)
            store(du, offset(du, b, s, c0 + d), acc);
          else
            store(dstate, offset(dstate, b, K - 1 + s, c0 + d), acc);
        }
      }
    }
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < K; ++j) store(dweight, offset(dweight, c0 + d, j), dwt[static_cast<std::size_t>(d * K + j)]);
  });
}

}  // namespace pathattn::cpu
