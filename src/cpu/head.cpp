#include "cpu/head.h"

namespace pathattn::cpu {

void gather(const TensorView& t, const Segment& s, int64_t head, int64_t X, float* out) {
  const float* base = static_cast<const float*>(t.data);
  for (int64_t i = 0; i < s.len; ++i) {
    const float* row = base + offset(t, s.b, s.t0 + i, head);
    if (t.ndim == 4) {
      for (int64_t d = 0; d < X; ++d) out[i * X + d] = row[d * t.strides[3]];
    } else {
      out[i] = row[0];
    }
  }
}

HeadData gather_head(const Problem& p, const Inputs& in, const Segment& s, int64_t h) {
  HeadData x;
  x.L = s.len;
  x.D = p.D;
  x.DV = p.DV;
  x.G = p.group;
  x.k.resize(x.L * x.D);
  x.w.resize(x.L * x.D);
  x.v.resize(x.L * x.DV);
  x.beta.resize(x.L);
  x.q.resize(x.G * x.L * x.D);
  gather(in.k, s, h, x.D, x.k.data());
  gather(in.w, s, h, x.D, x.w.data());
  gather(in.v, s, h, x.DV, x.v.data());
  gather(in.beta, s, h, 1, x.beta.data());
  std::vector<float> g(x.L);
  if (p.has_gate) x.gcum.resize(x.G * x.L);
  for (int64_t j = 0; j < x.G; ++j) {
    gather(in.q, s, h * x.G + j, x.D, x.q.data() + j * x.L * x.D);
    if (p.has_gate) {
      gather(in.g, s, h * x.G + j, 1, g.data());
      double acc = 0;
      for (int64_t t = 0; t < x.L; ++t) x.gcum[j * x.L + t] = (acc += g[t]);
    }
  }
  return x;
}

void scatter(const float* x, int64_t X, const TensorView& t, const Segment& s, int64_t head) {
  float* base = static_cast<float*>(t.data);
  for (int64_t i = 0; i < s.len; ++i) {
    float* row = base + offset(t, s.b, s.t0 + i, head);
    for (int64_t d = 0; d < X; ++d) row[d * t.strides[3]] = x[i * X + d];
  }
}

void scatter_scalar(const float* x, const TensorView& t, const Segment& s, int64_t head) {
  float* base = static_cast<float*>(t.data);
  for (int64_t i = 0; i < s.len; ++i) base[offset(t, s.b, s.t0 + i, head)] = x[i];
}

}  // namespace pathattn::cpu
