// Test harness: random PaTH problems from a spec, held in host buffers of any float type and layout,
// exposed as pathattn views; outputs live between guard bands that catch stray writes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "pathattn/pathattn.h"

namespace pathattn::test {

// near0/1/2: within 1e-3 of 0, 1 (singular H_t), 2 (a reflection); high: uniform in [1.9, 2]; exact0: every beta 0
// (PaTH is then plain softmax attention); exact2: every H_t an exact reflection.
enum class BetaDist { uniform, near0, near1, near2, high, exact0, exact2 };

inline const char* beta_name(BetaDist d) {
  switch (d) {
    case BetaDist::uniform: return "uniform";
    case BetaDist::near0: return "near0";
    case BetaDist::near1: return "near1";
    case BetaDist::near2: return "near2";
    case BetaDist::high: return "high";
    case BetaDist::exact0: return "exact0";
    case BetaDist::exact2: return "exact2";
  }
  return "?";
}

struct Spec {
  int64_t B = 1, T = 16, H = 1, HQ = 1, D = 16, DV = 16;
  bool gate = false;
  std::vector<int32_t> seqlens;  // non-empty: packed varlen batch (B must be 1, T = sum)
  BetaDist beta = BetaDist::uniform;
  bool permuted = false;  // inputs stored [B, H, T, D] and viewed as [B, T, H, D] (non-contiguous)
  uint64_t seed = 1;
  std::string name() const {
    std::string s = "B" + std::to_string(B) + "_T" + std::to_string(T) + "_H" + std::to_string(H) + "_HQ" +
                    std::to_string(HQ) + "_D" + std::to_string(D) + "_DV" + std::to_string(DV) + "_beta" +
                    beta_name(beta);
    if (gate) s += "_gate";
    if (!seqlens.empty()) s += "_varlen" + std::to_string(seqlens.size());
    if (permuted) s += "_permuted";
    return s;
  }
};

// gtest prints a failing case's parameter with this (instead of its bytes).
inline void PrintTo(const Spec& s, std::ostream* os) { *os << s.name() << "_seed" << s.seed; }

// Contiguous f64 master copy of a problem's inputs, drawn from the spec.
struct Problem64 {
  Spec spec;
  std::vector<double> q, k, v, w, beta, g;  // [B,T,HQ,D], [B,T,H,D], [B,T,H,DV], [B,T,H,D], [B,T,H], [B,T,HQ]
  std::vector<int32_t> cu;                  // [N + 1] when varlen

  explicit Problem64(const Spec& s) : spec(s) {
    std::mt19937_64 rng(s.seed);
    std::normal_distribution<double> n01(0.0, 1.0);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    const int64_t B = s.B, T = s.T;
    auto fill = [&](std::vector<double>& x, int64_t n) {
      x.resize(n);
      for (double& e : x) e = n01(rng);
    };
    fill(q, B * T * s.HQ * s.D);
    fill(k, B * T * s.H * s.D);
    fill(v, B * T * s.H * s.DV);
    fill(w, B * T * s.H * s.D);
    for (int64_t r = 0; r < B * T * s.H; ++r) {  // unit-norm directions
      double nn = 0;
      for (int64_t d = 0; d < s.D; ++d) nn += w[r * s.D + d] * w[r * s.D + d];
      for (int64_t d = 0; d < s.D; ++d) w[r * s.D + d] /= std::sqrt(nn);
    }
    beta.resize(B * T * s.H);
    for (double& b : beta) {
      const double e = 1e-3 * u01(rng);
      switch (s.beta) {
        case BetaDist::uniform: b = 2.0 * u01(rng); break;
        case BetaDist::near0: b = e; break;
        case BetaDist::near1: b = 1.0 + (u01(rng) < 0.5 ? -e : e); break;
        case BetaDist::near2: b = 2.0 - e; break;
        case BetaDist::high: b = 1.9 + 0.1 * u01(rng); break;
        case BetaDist::exact0: b = 0.0; break;
        case BetaDist::exact2: b = 2.0; break;
      }
    }
    if (s.gate) {  // log forget gates in about [-2, 0): logsigmoid of a normal
      g.resize(B * T * s.HQ);
      for (double& x : g) x = -std::log1p(std::exp(-(1.5 + n01(rng))));
    }
    if (!s.seqlens.empty()) {
      cu.push_back(0);
      for (int32_t l : s.seqlens) cu.push_back(cu.back() + l);
    }
  }
};

// The problem of `s` with its inputs rounded to f32, so that an f32 path and the f64 reference see exactly the same
// numbers and a comparison measures the computation only, not the rounding of the inputs.
inline Problem64 rounded_to_f32(const Spec& s) {
  Problem64 P(s);
  for (std::vector<double>* x : {&P.q, &P.k, &P.v, &P.w, &P.beta, &P.g})
    for (double& e : *x) e = static_cast<double>(static_cast<float>(e));
  return P;
}

// A fixed random output gradient dO [B, T, HQ, DV] and lse gradient dlse [B, T, HQ] (for losses that use lse too),
// seeded from the spec, so that every backend and baseline sees the same ones.
struct OutputGrads {
  std::vector<double> dout, dlse;
};
inline OutputGrads draw_output_grads(const Spec& s) {
  std::mt19937_64 rng(s.seed * 7919 + 17);
  std::normal_distribution<double> n01(0.0, 1.0);
  OutputGrads g;
  g.dout.resize(s.B * s.T * s.HQ * s.DV);
  for (double& x : g.dout) x = n01(rng);
  g.dlse.resize(s.B * s.T * s.HQ);
  for (double& x : g.dlse) x = n01(rng);
  return g;
}

// A buffer of type S for a tensor of up to 4 dims, with guard bands before and after.
template <typename S>
struct Buffer {
  static constexpr int64_t kGuard = 64;
  std::vector<S> mem;
  TensorView view;
  static S sentinel() { return S(-12345.678); }

  // Contiguous tensor of `sizes`; if permute_12, stored with dims 1 and 2 swapped (a permuted view).
  Buffer(std::vector<int64_t> sizes, DType dt, bool permute_12 = false) {
    int64_t n = 1;
    for (int64_t x : sizes) n *= x;
    mem.assign(n + 2 * kGuard, sentinel());
    view.data = mem.data() + kGuard;
    view.dtype = dt;
    view.ndim = static_cast<int>(sizes.size());
    std::vector<int64_t> store = sizes;
    if (permute_12 && sizes.size() >= 3) std::swap(store[1], store[2]);
    std::vector<int64_t> st(sizes.size());
    int64_t stride = 1;
    for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
      st[d] = stride;
      stride *= store[d];
    }
    if (permute_12 && sizes.size() >= 3) std::swap(st[1], st[2]);
    for (size_t d = 0; d < sizes.size(); ++d) {
      view.sizes[d] = sizes[d];
      view.strides[d] = st[d];
    }
  }
  S* data() { return static_cast<S*>(view.data); }
  int64_t off(const std::vector<int64_t>& idx) const {
    int64_t o = 0;
    for (size_t d = 0; d < idx.size(); ++d) o += idx[d] * view.strides[d];
    return o;
  }
  // Visits every logical index in row-major order with its linear (contiguous) position.
  template <typename F>
  void for_each(F f) const {
    int64_t idx[4] = {0, 0, 0, 0};
    const int nd = view.ndim;
    int64_t n = 1;
    for (int d = 0; d < nd; ++d) n *= view.sizes[d];
    for (int64_t lin = 0; lin < n; ++lin) {
      int64_t r = lin, o = 0;
      for (int d = nd - 1; d >= 0; --d) {
        idx[d] = r % view.sizes[d];
        r /= view.sizes[d];
        o += idx[d] * view.strides[d];
      }
      f(lin, o);
    }
  }
  void fill_from(const std::vector<double>& src) {
    for_each([&](int64_t lin, int64_t o) { data()[o] = S(src[lin]); });
  }
  std::vector<double> to_vector() const {
    std::vector<double> out(view.numel());
    for_each([&](int64_t lin, int64_t o) { out[lin] = double(static_cast<const S*>(view.data)[o]); });
    return out;
  }
  // True when the guard bands are untouched (no write outside the tensor).
  bool guards_intact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (mem[i] != sentinel() || mem[mem.size() - 1 - i] != sentinel()) return false;
    return true;
  }
};

template <typename S>
constexpr DType dtype_of() {
  return sizeof(S) == 8 ? DType::f64 : DType::f32;
}

// Inputs, outputs and gradients of one problem in type S.
template <typename S>
struct Case {
  const Problem64& P;
  Buffer<S> q, k, v, w, beta, g;
  Buffer<int32_t> cu;
  Buffer<S> o, lse, kcache, dout, dlse, dq, dk, dv, dw, dbeta, dg;
  Inputs in;

  explicit Case(const Problem64& p)
      : P(p),
        q(sz(p.spec.HQ, p.spec.D), dtype_of<S>(), p.spec.permuted),
        k(sz(p.spec.H, p.spec.D), dtype_of<S>(), p.spec.permuted),
        v(sz(p.spec.H, p.spec.DV), dtype_of<S>(), p.spec.permuted),
        w(sz(p.spec.H, p.spec.D), dtype_of<S>(), p.spec.permuted),
        beta({p.spec.B, p.spec.T, p.spec.H}, dtype_of<S>(), p.spec.permuted),
        g({p.spec.B, p.spec.T, p.spec.HQ}, dtype_of<S>(), p.spec.permuted),
        cu({static_cast<int64_t>(std::max<size_t>(p.cu.size(), 1))}, DType::i32),
        o(sz(p.spec.HQ, p.spec.DV), dtype_of<S>()),
        lse({p.spec.B, p.spec.T, p.spec.HQ}, dtype_of<S>()),
        kcache(sz(p.spec.H, p.spec.D), dtype_of<S>()),
        dout(sz(p.spec.HQ, p.spec.DV), dtype_of<S>()),
        dlse({p.spec.B, p.spec.T, p.spec.HQ}, dtype_of<S>()),
        dq(sz(p.spec.HQ, p.spec.D), dtype_of<S>()),
        dk(sz(p.spec.H, p.spec.D), dtype_of<S>()),
        dv(sz(p.spec.H, p.spec.DV), dtype_of<S>()),
        dw(sz(p.spec.H, p.spec.D), dtype_of<S>()),
        dbeta({p.spec.B, p.spec.T, p.spec.H}, dtype_of<S>()),
        dg({p.spec.B, p.spec.T, p.spec.HQ}, dtype_of<S>()) {
    q.fill_from(p.q);
    k.fill_from(p.k);
    v.fill_from(p.v);
    w.fill_from(p.w);
    beta.fill_from(p.beta);
    in.q = q.view;
    in.k = k.view;
    in.v = v.view;
    in.w = w.view;
    in.beta = beta.view;
    if (p.spec.gate) {
      g.fill_from(p.g);
      in.g = g.view;
    }
    if (!p.cu.empty()) {
      std::memcpy(cu.data(), p.cu.data(), p.cu.size() * sizeof(int32_t));
      in.cu_seqlens = cu.view;
    }
    const OutputGrads og = draw_output_grads(p.spec);
    dout.fill_from(og.dout);
    dlse.fill_from(og.dlse);  // used by backward_with_lse
  }
  std::vector<int64_t> sz(int64_t heads, int64_t dim) const { return {P.spec.B, P.spec.T, heads, dim}; }

  ForwardOutputs fwd_outputs(bool with_kcache) {
    ForwardOutputs out;
    out.o = o.view;
    out.lse = lse.view;
    if (with_kcache) out.kcache = kcache.view;
    return out;
  }
  Gradients grads() {
    Gradients gr;
    gr.dq = dq.view;
    gr.dk = dk.view;
    gr.dv = dv.view;
    gr.dw = dw.view;
    gr.dbeta = dbeta.view;
    if (P.spec.gate) gr.dg = dg.view;
    return gr;
  }
  void forward(Backend b, bool with_kcache = true) { pathattn::forward(in, fwd_outputs(with_kcache), b); }
  void backward(Backend b) { pathattn::backward(in, o.view, lse.view, dout.view, grads(), b); }
  // The gradients of sum(dO * o) + sum(dlse * lse).
  void backward_with_lse(Backend b) { pathattn::backward(in, o.view, lse.view, dout.view, dlse.view, grads(), b); }
  bool guards_intact() const {
    bool ok = o.guards_intact() && lse.guards_intact() && kcache.guards_intact();
    for (const Buffer<S>* b : {&dq, &dk, &dv, &dw, &dbeta, &dg}) ok = ok && b->guards_intact();
    return ok;
  }
};

// ||a - b|| / ||b|| (Frobenius); NaN anywhere gives +inf.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// ||a - b|| <= rel ||b|| + abs (L2 over the tensor), NaN never passes. Returns the ratio to that bound.
inline double bound_ratio(const std::vector<double>& a, const std::vector<double>& b, double rel, double abs) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / (rel * std::sqrt(den) + abs);
}

inline double max_abs_err(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

}  // namespace pathattn::test
