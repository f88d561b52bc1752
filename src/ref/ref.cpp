// The reference: PaTH attention as the key-cache recurrence of docs/spec.md §1 (docs/math.md Eq. 3).
// Obviously correct rather than fast: plain loops, one (sequence, kv head) at a time.
#include "ref/ref.h"

#include <cmath>
#include <limits>
#include <vector>

namespace pathattn::ref {
namespace {

// Per-(segment, kv head) copies of the inputs in the compute type S, indexed [t][...] for t in the segment.
template <typename S>
struct Head {
  int64_t L, D, DV, G;  // length, dims, query heads of this kv head
  std::vector<S> k, v, w, beta;  // [L, D], [L, DV], [L, D], [L]
  std::vector<S> q, gcum;        // [G, L, D], [G, L]: queries and cumulative gates G_t (Eq. 2) per query head
};

template <typename S>
Head<S> gather(const Problem& p, const Inputs& in, const Segment& s, int64_t h) {
  Head<S> x{s.len, p.D, p.DV, p.group, {}, {}, {}, {}, {}, {}};
  x.k.resize(s.len * p.D);
  x.w.resize(s.len * p.D);
  x.v.resize(s.len * p.DV);
  x.beta.resize(s.len);
  x.q.resize(p.group * s.len * p.D);
  x.gcum.assign(p.group * s.len, S(0));
  for (int64_t t = 0; t < s.len; ++t) {
    const int64_t r = s.t0 + t;
    for (int64_t d = 0; d < p.D; ++d) {
      x.k[t * p.D + d] = S(load(in.k, offset(in.k, s.b, r, h, d)));
      x.w[t * p.D + d] = S(load(in.w, offset(in.w, s.b, r, h, d)));
    }
    for (int64_t d = 0; d < p.DV; ++d) x.v[t * p.DV + d] = S(load(in.v, offset(in.v, s.b, r, h, d)));
    x.beta[t] = S(load(in.beta, offset(in.beta, s.b, r, h)));
    for (int64_t j = 0; j < p.group; ++j) {
      const int64_t hq = h * p.group + j;
      for (int64_t d = 0; d < p.D; ++d) x.q[(j * s.len + t) * p.D + d] = S(load(in.q, offset(in.q, s.b, r, hq, d)));
      if (p.has_gate) {
        S prev = t > 0 ? x.gcum[j * s.len + t - 1] : S(0);
        x.gcum[j * s.len + t] = prev + S(load(in.g, offset(in.g, s.b, r, hq)));
      }
    }
  }
  return x;
}

template <typename S>
S dot(const S* a, const S* b, int64_t n) {
  S s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Eq. 3: cache <- H_t cache, i.e. every cached key c_j becomes c_j - beta_t (c_j . w_t) w_t.
template <typename S>
void apply_householder(S* cache, int64_t rows, const S* w, S beta, int64_t D) {
  for (int64_t j = 0; j < rows; ++j) {
    S* c = cache + j * D;
    const S a = beta * dot(c, w, D);
    for (int64_t d = 0; d < D; ++d) c[d] -= a * w[d];
  }
}

// All caches of one head: row block t holds the keys 0..t carried to step t (Eq. 3), [L(L+1)/2, D].
template <typename S>
std::vector<S> all_caches(const Head<S>& x) {
  std::vector<S> tri(x.L * (x.L + 1) / 2 * x.D);
  for (int64_t t = 0; t < x.L; ++t) {
    S* cur = tri.data() + t * (t + 1) / 2 * x.D;
    if (t > 0) {
      const S* prev = tri.data() + (t - 1) * t / 2 * x.D;
      std::copy(prev, prev + t * x.D, cur);
      apply_householder(cur, t, &x.w[t * x.D], x.beta[t], x.D);
    }
    std::copy(&x.k[t * x.D], &x.k[(t + 1) * x.D], cur + t * x.D);
  }
  return tri;
}

// Logits of query head j at step t against the cache (Eq. 4): l_i = scale q_t . c_i + G_t - G_i.
template <typename S>
void logits(const Head<S>& x, const Problem& p, int64_t j, int64_t t, const S* cache, std::vector<S>& l) {
  l.resize(t + 1);
  const S* qt = &x.q[(j * x.L + t) * x.D];
  for (int64_t i = 0; i <= t; ++i)
    l[i] = S(p.scale) * dot(qt, cache + i * x.D, x.D) + (x.gcum[j * x.L + t] - x.gcum[j * x.L + i]);
}

template <typename S>
void forward_typed(const Problem& p, const Inputs& in, const ForwardOutputs& out) {
  parallel_for(static_cast<int64_t>(p.segments.size()) * p.H, [&](int64_t task) {
    const Segment& s = p.segments[task / p.H];
    const int64_t h = task % p.H;
    Head<S> x = gather<S>(p, in, s, h);
    std::vector<S> cache(x.L * x.D), l;
    for (int64_t t = 0; t < x.L; ++t) {
      if (t > 0) apply_householder(cache.data(), t, &x.w[t * x.D], x.beta[t], x.D);
      std::copy(&x.k[t * x.D], &x.k[(t + 1) * x.D], &cache[t * x.D]);
      for (int64_t j = 0; j < x.G; ++j) {
        logits(x, p, j, t, cache.data(), l);
        S m = -std::numeric_limits<S>::infinity();
        for (S li : l) m = std::max(m, li);
        S sum = 0;
        for (S& li : l) sum += (li = std::exp(li - m));
        const int64_t hq = h * x.G + j;
        for (int64_t d = 0; d < x.DV; ++d) {
          S acc = 0;
          for (int64_t i = 0; i <= t; ++i) acc += l[i] * x.v[i * x.DV + d];
          store(out.o, offset(out.o, s.b, s.t0 + t, hq, d), acc / sum);
        }
        store(out.lse, offset(out.lse, s.b, s.t0 + t, hq), m + std::log(sum));
      }
    }
    if (out.kcache.defined())
      for (int64_t t = 0; t < x.L; ++t)
        for (int64_t d = 0; d < x.D; ++d)
          store(out.kcache, offset(out.kcache, s.b, s.t0 + t, h, d), cache[t * x.D + d]);
  });
}

// Backward of the recurrence (docs/math.md Eq. 5-9): softmax backward per step, then one reverse sweep
// that carries the gradient of the key cache back through each H_t.
template <typename S>
void backward_typed(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse,
                    const TensorView& dout, const TensorView& dlse, const Gradients& gr) {
  parallel_for(static_cast<int64_t>(p.segments.size()) * p.H, [&](int64_t task) {
    const Segment& s = p.segments[task / p.H];
    const int64_t h = task % p.H;
    Head<S> x = gather<S>(p, in, s, h);
    const int64_t L = x.L, D = x.D, DV = x.DV;
    const std::vector<S> tri = all_caches(x);
    auto cache_at = [&](int64_t t) { return tri.data() + t * (t + 1) / 2 * D; };

    // dS[j][t][i] = d loss / d (q_t . c_i) for query head j (Eq. 5-6), and the query-side gradients.
    std::vector<S> ds(x.G * L * L, S(0)), dv(L * DV, S(0)), l, dov(DV);
    for (int64_t j = 0; j < x.G; ++j) {
      const int64_t hq = h * x.G + j;
      std::vector<S> dgcum(L, S(0));
      for (int64_t t = 0; t < L; ++t) {
        const int64_t r = s.t0 + t;
        logits(x, p, j, t, cache_at(t), l);
        const S lse_t = S(load(lse, offset(lse, s.b, r, hq)));
        S delta = 0;  // Eq. 6: delta_t = dO_t . O_t - dlse_t (d lse_t / d l_ti = P_ti)
        for (int64_t d = 0; d < DV; ++d) {
          dov[d] = S(load(dout, offset(dout, s.b, r, hq, d)));
          delta += dov[d] * S(load(o, offset(o, s.b, r, hq, d)));
        }
        if (dlse.defined()) delta -= S(load(dlse, offset(dlse, s.b, r, hq)));
        std::vector<S> dq(D, S(0));
        for (int64_t i = 0; i <= t; ++i) {
          const S prob = std::exp(l[i] - lse_t);
          const S dl = prob * (dot(dov.data(), &x.v[i * DV], DV) - delta);
          for (int64_t d = 0; d < DV; ++d) dv[i * DV + d] += prob * dov[d];
          const S dsi = S(p.scale) * dl;
          ds[(j * L + t) * L + i] = dsi;
          for (int64_t d = 0; d < D; ++d) dq[d] += dsi * cache_at(t)[i * D + d];
          dgcum[t] += dl;  // Eq. 7: l_ti depends on G_t - G_i
          dgcum[i] -= dl;
        }
        for (int64_t d = 0; d < D; ++d) store(gr.dq, offset(gr.dq, s.b, r, hq, d), dq[d]);
      }
      if (p.has_gate) {  // G_t = g_1 + ... + g_t, so dg_t = sum_{i >= t} dG_i
        S run = 0;
        for (int64_t t = L - 1; t >= 0; --t) {
          run += dgcum[t];
          store(gr.dg, offset(gr.dg, s.b, s.t0 + t, hq), run);
        }
      }
    }

    // Reverse sweep (Eq. 8-9). dc[i] = d loss / d c_i^(t), the gradient of cache entry i at step t.
    std::vector<S> dc(L * D, S(0));
    for (int64_t t = L - 1; t >= 0; --t) {
      for (int64_t j = 0; j < x.G; ++j)
        for (int64_t i = 0; i <= t; ++i) {
          const S dsi = ds[(j * L + t) * L + i];
          const S* qt = &x.q[(j * L + t) * D];
          for (int64_t d = 0; d < D; ++d) dc[i * D + d] += dsi * qt[d];
        }
      const int64_t r = s.t0 + t;
      for (int64_t d = 0; d < D; ++d) store(gr.dk, offset(gr.dk, s.b, r, h, d), dc[t * D + d]);
      // c_i^(t) = H_t c_i^(t-1) for i < t: gradients of beta_t, w_t, and c^(t-1).
      const S* wt = &x.w[t * D];
      const S bt = x.beta[t];
      std::vector<S> dw(D, S(0));
      S dbeta = 0;
      if (t > 0) {
        const S* prev = cache_at(t - 1);
        for (int64_t i = 0; i < t; ++i) {
          S* g = &dc[i * D];
          const S wg = dot(wt, g, D), wc = dot(wt, prev + i * D, D);
          dbeta -= wg * wc;
          for (int64_t d = 0; d < D; ++d) {
            dw[d] -= bt * (g[d] * wc + prev[i * D + d] * wg);
            g[d] -= bt * wg * wt[d];  // H_t is symmetric: d c^(t-1) = H_t d c^(t)
          }
        }
      }
      for (int64_t d = 0; d < D; ++d) store(gr.dw, offset(gr.dw, s.b, r, h, d), dw[d]);
      store(gr.dbeta, offset(gr.dbeta, s.b, r, h), dbeta);
      for (int64_t d = 0; d < DV; ++d) store(gr.dv, offset(gr.dv, s.b, r, h, d), dv[t * DV + d]);
    }
  });
}

}  // namespace

void forward(const Problem& p, const Inputs& in, const ForwardOutputs& out) {
  if (p.dtype == DType::f64)
    forward_typed<double>(p, in, out);
  else
    forward_typed<float>(p, in, out);
}

void backward(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const TensorView& dlse, const Gradients& grads) {
  if (p.dtype == DType::f64)
    backward_typed<double>(p, in, o, lse, dout, dlse, grads);
  else
    backward_typed<float>(p, in, o, lse, dout, dlse, grads);
}

}  // namespace pathattn::ref
