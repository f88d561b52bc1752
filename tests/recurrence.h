// The recurrence of docs/math.md (Eq. 3-4 forward, Eq. 5-9 reverse sweep) written once, for two jobs:
//
//  * operands = f64: an f64 oracle with checkpoints. The reference (src/ref) keeps every transformed key, O(T^2 D)
//    memory per head, which T = 16384 cannot afford; this one stores the key cache every K steps and recomputes a
//    segment's caches in the reverse sweep, O((T / K + K) T D) memory. Proven equal to the reference's gradients
//    by tests/test_recurrence.cpp.
//  * operands = bf16 / f16: "the same math done plainly in low precision", the yardstick of FlashAttention's rule
//    for the CUDA backward (tests/tolerances.h kLowPrecisionFactor), as lowp_baseline.h is for the forward:
//      - q, k, v, dO rounded as the kernel's inputs are; w in f32, or bf16 when the kernel is given w in bf16;
//      - every product operand rounded: the cached key in a logit and in dq (the kernel's K~), p before dV = p^T dO,
//        ds before dq = ds K~ and the key-cache gradient e += ds q; f32 accumulation;
//      - beta, w, the Householder updates of the cache (Eq. 3) and of its gradient (Eq. 8-9) in f32, the gate sum
//        G in f64 (docs/spec.md §6 keeps them so);
//      - softmax in f32 from the forward's f32 lse; delta = dO . o with o as the forward stores it (rounded);
//      - every output rounded to the dtype the kernel writes (dq like q, dk and dv like k, dw like w, dbeta, dg f32).
//
// Parallel without a barrier per step: the rows of the key cache evolve independently (Eq. 3, 8-9 are row by row),
// so blocks of rows run through a window of steps on their own and leave per (step, block) partial sums over keys,
// combined afterwards in block order: results do not depend on the thread count (and, recomputation repeating the
// same operations, not on K either). Cost O(T^2 D G): T = 16384, D = 64, HQ = 2 takes about 160 s (f64) and 105 s
// (bf16) on one core (-march=native), and divides over the cores (blocks of T / 64 rows).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "harness.h"
#include "lowp_round.h"

namespace pathattn::test {

struct RecurrenceOptions {
  DType operands = DType::f64;  // f64: exact (double everywhere); bf16 / f16: the low-precision baseline
  bool w_bf16 = false;          // the kernel is given w in bf16 (else f32); low-precision operands only
  int64_t checkpoint = 0;       // K: the key cache is stored every K steps; 0: ceil(sqrt(T / 2)), which minimises
                                // checkpoints (T^2 D / 2K) plus one segment's caches (K T D)
  int64_t block_rows = 0;       // key-cache rows per parallel work item; 0: max(64, T / 64), enough blocks to balance
                                // 16 threads and few enough that the per-block partial sums stay small
};

// Contiguous, in the layouts of the API (harness's Buffer::to_vector gives the same order).
struct RecurrenceResult {
  std::vector<double> o, lse;   // [B, T, HQ, DV], [B, T, HQ]
  std::vector<double> dq, dk;   // [B, T, HQ, D], [B, T, H, D]
  std::vector<double> dv, dw;   // [B, T, H, DV], [B, T, H, D]
  std::vector<double> dbeta;    // [B, T, H]
  std::vector<double> dg;       // [B, T, HQ], empty without a gate
};

namespace recurrence_detail {

// The rounding of a product operand: none in f64, to the low precision otherwise.
struct NoRound {
  double operator()(double x) const { return x; }
};
template <DType DT>
struct RoundTo {
  float operator()(float x) const { return DT == DType::bf16 ? round_bf16(x) : round_f16(x); }
};

// Four partial sums: a single chain is bound by the add latency; the order is fixed, so results stay reproducible.
template <typename S>
inline S dot(const S* a, const S* b, int64_t n) {
  S s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// Runs f(block) over [0, nblk) in parallel. A block writes only its own rows and partial-sum slots, so the
// schedule does not change any result.
template <typename F>
inline void for_blocks(int64_t nblk, const F& f) {
#pragma omp parallel for schedule(dynamic) if (nblk >= 2)
  for (int64_t blk = 0; blk < nblk; ++blk) f(blk);
}

// One (sequence, kv head): L tokens, G query heads. Inputs as the computation sees them (rounded where the kernel's
// inputs are), in S: double for the oracle, float for the baseline.
template <typename S>
struct Head {
  int64_t L = 0, D = 0, DV = 0, G = 0;
  std::vector<S> q, dout;      // [G, L, D], [G, L, DV]
  std::vector<S> k, v, w;      // [L, D], [L, DV], [L, D]
  std::vector<S> beta;         // [L]
  std::vector<S> dlse;         // [G, L] (zero when absent)
  std::vector<double> gcum;    // [G, L] cumulative gates G_t (Eq. 2), in f64
};

template <typename S, typename R>
class Runner {
  static constexpr bool kLowp = !std::is_same_v<R, NoRound>;

 public:
  Runner(const Problem64& P, const std::vector<double>& dout, const std::vector<double>& dlse,
         const RecurrenceOptions& opt, RecurrenceResult& out)
      : P_(P), s_(P.spec), dout_(dout), dlse_(dlse), opt_(opt), out_(out) {}

  // Forward and backward of sequence b, tokens [t0, t0 + L), kv head h.
  void run(int64_t b, int64_t t0, int64_t L, int64_t h) {
    b_ = b, t0_ = t0, h_ = h;
    gather(L);
    K_ = opt_.checkpoint > 0 ? opt_.checkpoint : std::max<int64_t>(1, int64_t(std::ceil(std::sqrt(L / 2.0))));
    R_ = opt_.block_rows > 0 ? opt_.block_rows : std::max<int64_t>(64, (L + 63) / 64);
    forward();
    backward();
  }

 private:
  int64_t row(int64_t t, int64_t heads, int64_t hh) const { return (b_ * s_.T + t0_ + t) * heads + hh; }
  int64_t nblocks(int64_t rows) const { return (rows + R_ - 1) / R_; }

  void gather(int64_t L) {
    const int64_t D = s_.D, DV = s_.DV, G = s_.HQ / s_.H;
    Head<S>& x = x_;
    x.L = L, x.D = D, x.DV = DV, x.G = G;
    x.q.resize(G * L * D), x.dout.resize(G * L * DV), x.k.resize(L * D), x.v.resize(L * DV), x.w.resize(L * D);
    x.beta.resize(L), x.dlse.assign(G * L, S(0)), x.gcum.assign(G * L, 0.0);
    for (int64_t t = 0; t < L; ++t) {
      const int64_t rk = row(t, s_.H, h_);
      for (int64_t d = 0; d < D; ++d) {
        x.k[t * D + d] = rnd_(S(P_.k[rk * D + d]));
        const S w = S(P_.w[rk * D + d]);
        x.w[t * D + d] = kLowp && opt_.w_bf16 ? S(round_bf16(float(w))) : w;
      }
      for (int64_t d = 0; d < DV; ++d) x.v[t * DV + d] = rnd_(S(P_.v[rk * DV + d]));
      x.beta[t] = S(P_.beta[rk]);
      for (int64_t j = 0; j < G; ++j) {
        const int64_t rq = row(t, s_.HQ, h_ * G + j);
        for (int64_t d = 0; d < D; ++d) x.q[(j * L + t) * D + d] = rnd_(S(P_.q[rq * D + d]));
        for (int64_t d = 0; d < DV; ++d) x.dout[(j * L + t) * DV + d] = rnd_(S(dout_[rq * DV + d]));
        if (!dlse_.empty()) x.dlse[j * L + t] = S(dlse_[rq]);
        if (s_.gate) x.gcum[j * L + t] = (t > 0 ? x.gcum[j * L + t - 1] : 0.0) + double(S(P_.g[rq]));
      }
    }
  }

  // Eq. 3 for one cache row: dst = H_t src (dst may be src).
  void householder(const S* src, S* dst, int64_t t) const {
    const int64_t D = x_.D;
    const S* w = &x_.w[t * D];
    const S a = x_.beta[t] * dot(src, w, D);
    for (int64_t d = 0; d < D; ++d) dst[d] = src[d] - a * w[d];
  }

  // Logit of query head j at step t against the (rounded) cached key kr of row i (Eq. 4).
  S logit(int64_t j, int64_t t, int64_t i, const S* kr) const {
    const Head<S>& x = x_;
    return scale_ * dot(&x.q[(j * x.L + t) * x.D], kr, x.D) + S(x.gcum[j * x.L + t] - x.gcum[j * x.L + i]);
  }

  // Rows [i0, i1) of block blk of the key cache.
  int64_t row0(int64_t blk) const { return blk * R_; }
  int64_t row1(int64_t blk) const { return std::min(x_.L, (blk + 1) * R_); }

  // Eq. 3 for the rows of block blk that exist at step t: dst = H_t src for rows i < t, row t = k_t (dst may be src).
  // src and dst hold row i at (i - base) * D.
  void advance(int64_t blk, int64_t t, const S* src, S* dst, int64_t base = 0) const {
    const int64_t D = x_.D;
    for (int64_t i = row0(blk); i < std::min(row1(blk), t + 1); ++i)
      if (i < t)
        householder(&src[(i - base) * D], &dst[(i - base) * D], t);
      else
        std::copy(&x_.k[t * D], &x_.k[(t + 1) * D], &dst[(i - base) * D]);
  }

  // The steps run in windows of K (the checkpoint interval): in a window every block of rows carries its rows
  // through the window's steps on its own (the rows are independent), leaving per (step, block) the partial
  // softmax (max, sum, p v) of flash-decoding; the partials are then combined in block order.
  void forward() {
    const Head<S>& x = x_;
    const int64_t L = x.L, D = x.D, DV = x.DV, G = x.G;
    ckpt_.assign((L + K_ - 1) / K_, {});
    o_.assign(G * L * DV, S(0));
    lse_.assign(G * L, S(0));
    std::vector<S> cache(L * D);  // [L, D] row i: c_i^(t) for the latest step t its block has reached
    std::vector<S> pm, ps, ppv;   // [K, nb, G], [K, nb, G], [K, nb, G, DV] partial max, sum, p v per step and block
    for (int64_t m = 0; m * K_ < L; ++m) {
      const int64_t s0 = m * K_, s1 = std::min(L, s0 + K_), nb = nblocks(s1);
      ckpt_[m].assign(cache.begin(), cache.begin() + s0 * D);  // c^(s0 - 1), rows 0..s0-1
      pm.assign(K_ * nb * G, -INFINITY), ps.assign(K_ * nb * G, S(0)), ppv.assign(K_ * nb * G * DV, S(0));
      for_blocks(nb, [&](int64_t blk) {
        std::vector<S> kr(D), l(R_ * G);  // one rounded key; [R, G] logits of the block's rows
        for (int64_t t = std::max(s0, row0(blk)); t < s1; ++t) {
          const int64_t i0 = row0(blk), i1 = std::min(row1(blk), t + 1), at = (t - s0) * nb + blk;
          advance(blk, t, cache.data(), cache.data());
          for (int64_t i = i0; i < i1; ++i) {
            for (int64_t d = 0; d < D; ++d) kr[d] = rnd_(cache[i * D + d]);
            for (int64_t j = 0; j < G; ++j) {
              l[(i - i0) * G + j] = logit(j, t, i, kr.data());
              pm[at * G + j] = std::max(pm[at * G + j], l[(i - i0) * G + j]);
            }
          }
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = 0; j < G; ++j) {
              const S p = std::exp(l[(i - i0) * G + j] - pm[at * G + j]);
              ps[at * G + j] += p;
              const S pr = rnd_(p);
              S* acc = &ppv[(at * G + j) * DV];
              for (int64_t d = 0; d < DV; ++d) acc[d] += pr * x.v[i * DV + d];
            }
        }
      });
      for (int64_t t = s0; t < s1; ++t)
        for (int64_t j = 0; j < G; ++j) {
          const int64_t nbt = nblocks(t + 1);  // blocks with a row at step t
          S mx = -INFINITY, sum = 0;
          std::vector<S> pv(DV, S(0));
          for (int64_t blk = 0; blk < nbt; ++blk) mx = std::max(mx, pm[((t - s0) * nb + blk) * G + j]);
          for (int64_t blk = 0; blk < nbt; ++blk) {
            const int64_t at = ((t - s0) * nb + blk) * G + j;
            const S f = std::exp(pm[at] - mx);
            sum += f * ps[at];
            for (int64_t d = 0; d < DV; ++d) pv[d] += f * ppv[at * DV + d];
          }
          const int64_t rq = row(t, s_.HQ, h_ * G + j);
          for (int64_t d = 0; d < DV; ++d) {
            o_[(j * L + t) * DV + d] = rnd_(pv[d] / sum);  // o as the forward stores it
            out_.o[rq * DV + d] = double(o_[(j * L + t) * DV + d]);
          }
          lse_[j * L + t] = mx + std::log(sum);
          out_.lse[rq] = double(lse_[j * L + t]);
        }
    }
  }

  // The reverse sweep, one checkpoint segment [s0, s1) at a time, last first: every block of rows recomputes its
  // rows' caches c^(s0-1) .. c^(s1-1) from the checkpoint, then walks t down through the segment (Eq. 5-9), leaving
  // per (step, block) its part of the sums over keys (dq_t, dG_t, dbeta_t, dw_t), combined in block order.
  void backward() {
    const Head<S>& x = x_;
    const int64_t L = x.L, D = x.D, DV = x.DV, G = x.G;
    std::vector<S> e(L * D, S(0));    // [L, D] e_i = d loss / d c_i^(t) at the step t its block has reached (Eq. 8-9)
    std::vector<S> dv(L * DV, S(0));  // [L, DV] Eq. 5, summed over steps and query heads
    std::vector<S> dG(G * L, S(0));   // [G, L] d loss / d G_t (Eq. 7)
    std::vector<S> delta(G * L);      // [G, L] dO_t . o_t - dlse_t (Eq. 6)
    for (int64_t j = 0; j < G; ++j)
      for (int64_t t = 0; t < L; ++t)
        delta[j * L + t] = dot(&x.dout[(j * L + t) * DV], &o_[(j * L + t) * DV], DV) - x.dlse[j * L + t];
    std::vector<S> bdq, bdG, bdbeta, bdw;  // [K, nb, G, D], [K, nb, G], [K, nb], [K, nb, D]
    std::vector<std::vector<S>> states(omp_get_max_threads());  // per thread: [K + 1, R, D] a block's caches
    for (int64_t m = int64_t(ckpt_.size()) - 1; m >= 0; --m) {
      const int64_t s0 = m * K_, s1 = std::min(L, s0 + K_), nb = nblocks(s1);
      bdq.assign(K_ * nb * G * D, S(0)), bdG.assign(K_ * nb * G, S(0));
      bdbeta.assign(K_ * nb, S(0)), bdw.assign(K_ * nb * D, S(0));
      for_blocks(nb, [&](int64_t blk) {
        const int64_t i0 = row0(blk);
        std::vector<S>& st = states[omp_get_thread_num()];
        st.resize((K_ + 1) * R_ * D);
        // state(u) = c^(s0 - 1 + u) for the block's rows, row i at (i - i0) * D.
        auto state = [&](int64_t u) { return st.data() + u * R_ * D; };
        for (int64_t i = i0; i < std::min(row1(blk), s0); ++i)
          std::copy(&ckpt_[m][i * D], &ckpt_[m][(i + 1) * D], state(0) + (i - i0) * D);
        for (int64_t t = std::max(s0, i0); t < s1; ++t) advance(blk, t, state(t - s0), state(t - s0 + 1), i0);
        std::vector<S> kr(D);
        for (int64_t t = s1 - 1; t >= std::max(s0, i0); --t) {
          const S* cur = state(t - s0 + 1);
          const S* prev = state(t - s0);
          const S* wt = &x.w[t * D];
          const S bt = x.beta[t];
          const int64_t at = (t - s0) * nb + blk;
          for (int64_t i = i0; i < std::min(row1(blk), t + 1); ++i) {
            for (int64_t d = 0; d < D; ++d) kr[d] = rnd_(cur[(i - i0) * D + d]);
            S* ei = &e[i * D];
            for (int64_t j = 0; j < G; ++j) {  // Eq. 5-7 for the logit l_ti of query head j
              const S* dO = &x.dout[(j * L + t) * DV];
              const S p = std::exp(logit(j, t, i, kr.data()) - lse_[j * L + t]);
              const S dl = p * (dot(dO, &x.v[i * DV], DV) - delta[j * L + t]);
              const S pr = rnd_(p), ds = rnd_(scale_ * dl);
              for (int64_t d = 0; d < DV; ++d) dv[i * DV + d] += pr * dO[d];
              const S* qt = &x.q[(j * L + t) * D];
              S* dq = &bdq[(at * G + j) * D];
              for (int64_t d = 0; d < D; ++d) {
                dq[d] += ds * kr[d];
                ei[d] += ds * qt[d];
              }
              dG[j * L + i] -= dl;  // l_ti depends on G_t - G_i; the G_t part is summed over blocks below
              bdG[at * G + j] += dl;
            }
            if (i == t) continue;  // c_t^(t) = k_t: no Householder step, e_t is dk_t
            // Eq. 8-9: c_i^(t) = H_t c_i^(t-1).
            const S* ci = &prev[(i - i0) * D];
            const S a = dot(wt, ei, D), b = dot(wt, ci, D);
            bdbeta[at] -= a * b;
            S* dw = &bdw[at * D];
            for (int64_t d = 0; d < D; ++d) {
              dw[d] -= bt * (a * ci[d] + b * ei[d]);
              ei[d] -= bt * a * wt[d];
            }
          }
        }
      });
      ckpt_[m] = {};
      for (int64_t t = s0; t < s1; ++t) {  // the sums over keys, in block order; e_t is final once step t is done
        const int64_t nbt = nblocks(t + 1), rk = row(t, s_.H, h_);
        S dbeta = 0;
        std::vector<S> dw(D, S(0));
        for (int64_t blk = 0; blk < nbt; ++blk) {
          const int64_t at = (t - s0) * nb + blk;
          dbeta += bdbeta[at];
          for (int64_t d = 0; d < D; ++d) dw[d] += bdw[at * D + d];
        }
        for (int64_t d = 0; d < D; ++d) {
          out_.dk[rk * D + d] = double(rnd_(e[t * D + d]));
          out_.dw[rk * D + d] = kLowp && opt_.w_bf16 ? double(round_bf16(float(dw[d]))) : double(dw[d]);
        }
        out_.dbeta[rk] = double(dbeta);
        for (int64_t j = 0; j < G; ++j) {
          std::vector<S> dq(D, S(0));
          for (int64_t blk = 0; blk < nbt; ++blk) {
            const int64_t at = (t - s0) * nb + blk;
            dG[j * L + t] += bdG[at * G + j];
            for (int64_t d = 0; d < D; ++d) dq[d] += bdq[(at * G + j) * D + d];
          }
          const int64_t rq = row(t, s_.HQ, h_ * G + j);
          for (int64_t d = 0; d < D; ++d) out_.dq[rq * D + d] = double(rnd_(dq[d]));
        }
      }
    }
    for (int64_t t = 0; t < L; ++t)
      for (int64_t d = 0; d < DV; ++d) out_.dv[row(t, s_.H, h_) * DV + d] = double(rnd_(dv[t * DV + d]));
    if (s_.gate)  // G_t = g_1 + ... + g_t, so dg_t = sum_{i >= t} dG_i
      for (int64_t j = 0; j < G; ++j) {
        S run = 0;
        for (int64_t t = L - 1; t >= 0; --t) out_.dg[row(t, s_.HQ, h_ * G + j)] = double(run += dG[j * L + t]);
      }
  }

  const Problem64& P_;
  const Spec& s_;
  const std::vector<double>& dout_;
  const std::vector<double>& dlse_;
  const RecurrenceOptions& opt_;
  RecurrenceResult& out_;
  R rnd_{};
  S scale_ = S(1.0 / std::sqrt(double(P_.spec.D)));
  int64_t b_ = 0, t0_ = 0, h_ = 0;
  int64_t K_ = 1, R_ = 64;  // checkpoint interval, rows per block
  Head<S> x_;
  std::vector<std::vector<S>> ckpt_;  // ckpt_[m]: c^(mK - 1), rows 0..mK-1 (Eq. 3)
  std::vector<S> o_, lse_;            // [G, L, DV], [G, L] the forward's outputs as stored
};

template <typename S, typename R>
void run_all(const Problem64& P, const std::vector<double>& dout, const std::vector<double>& dlse,
             const RecurrenceOptions& opt, RecurrenceResult& out) {
  const Spec& s = P.spec;
  Runner<S, R> runner(P, dout, dlse, opt, out);
  for (int64_t h = 0; h < s.H; ++h) {
    if (P.cu.empty())
      for (int64_t b = 0; b < s.B; ++b) runner.run(b, 0, s.T, h);
    else
      for (size_t n = 0; n + 1 < P.cu.size(); ++n) runner.run(0, P.cu[n], P.cu[n + 1] - P.cu[n], h);
  }
}

}  // namespace recurrence_detail

// Forward and backward of problem P for output gradient dout [B, T, HQ, DV] and lse gradient dlse [B, T, HQ]
// (empty: zero). Sequences and heads run one after the other; the rows of one step run in parallel (OpenMP).
inline RecurrenceResult run_recurrence(const Problem64& P, const std::vector<double>& dout,
                                       const std::vector<double>& dlse, const RecurrenceOptions& opt = {}) {
  using namespace recurrence_detail;
  const Spec& s = P.spec;
  RecurrenceResult r;
  r.o.assign(s.B * s.T * s.HQ * s.DV, 0.0);
  r.lse.assign(s.B * s.T * s.HQ, 0.0);
  r.dq.assign(s.B * s.T * s.HQ * s.D, 0.0);
  r.dk.assign(s.B * s.T * s.H * s.D, 0.0);
  r.dv.assign(s.B * s.T * s.H * s.DV, 0.0);
  r.dw.assign(s.B * s.T * s.H * s.D, 0.0);
  r.dbeta.assign(s.B * s.T * s.H, 0.0);
  if (s.gate) r.dg.assign(s.B * s.T * s.HQ, 0.0);
  switch (opt.operands) {
    case DType::bf16: run_all<float, RoundTo<DType::bf16>>(P, dout, dlse, opt, r); break;
    case DType::f16: run_all<float, RoundTo<DType::f16>>(P, dout, dlse, opt, r); break;
    default: run_all<double, NoRound>(P, dout, dlse, opt, r); break;
  }
  return r;
}

}  // namespace pathattn::test
