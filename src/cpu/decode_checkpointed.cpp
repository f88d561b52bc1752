// Decoding on a checkpointed cache (docs/math.md Eq. 35-37, docs/spec.md §4): the rows before the checkpoint are
// carried only to it and read, not rewritten, at each token; the query is carried back instead by the product of
// the pending tokens' factors M = H_c ... H_t, kept up to date with one D x D update per token (Eq. 37), so that
// carrying the query is one matrix-vector product whatever the number of pending tokens; every P tokens the old
// rows are carried by M at once (Eq. 36).
//
// Token by token, as the definition reads (Eq. 3-4 for the recent rows, Eq. 35 for the old ones), per (sequence,
// kv head), in f32 with the gate differences in f64. Each token costs O(L D + D^2) per head like the plain
// decode's O(L D); the layout is for the GPU's memory traffic (the old rows are only read), which the plain CPU
// decode (one UT factor per 64 tokens, src/cpu/decode.cpp) does not need. Kept close to the equations so that it
// is the readable statement of what a checkpointed GPU kernel must compute.
#include <cmath>
#include <vector>

#include "cpu/cpu.h"

namespace pathattn::cpu {
namespace {

// Rows of a [B, T, heads, X] f32 view at fixed (b, head): element (j, d) at base[j rs + d es].
struct RowView {
  float* base;
  int64_t rs, es;
  float* row(int64_t j) const { return base + j * rs; }
};
RowView rows_of(const TensorView& t, int64_t b, int64_t head) {
  return {static_cast<float*>(t.data) + offset(t, b, 0, head), t.strides[1], t.ndim == 4 ? t.strides[3] : 1};
}

// After token t is appended: are P tokens pending since the checkpoint c (Eq. 36)? The one rule of the refresh,
// for the carry inside decode_head and for the checkpoint the call leaves behind.
bool refresh_due(int64_t t, int64_t c, int64_t P) { return t + 1 - c == P; }

float dot(const float* x, int64_t xs, const float* y, int64_t ys, int64_t n) {
  float acc = 0.f;
  for (int64_t d = 0; d < n; ++d) acc += x[d * xs] * y[d * ys];
  return acc;
}
// x <- H x = x - beta (w . x) w  (Eq. 1), w with element stride ws, x contiguous or strided (xs).
void householder(float* x, int64_t xs, const float* w, int64_t ws, float beta, int64_t D) {
  const float a = beta * dot(w, ws, x, xs, D);
  for (int64_t d = 0; d < D; ++d) x[d * xs] -= a * w[d * ws];
}

void decode_head(const Problem& p, const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out, int64_t b,
                 int64_t h) {
  const int64_t D = p.D, DV = p.DV, G = p.group, S = p.T, P = cache.ckpt_period;
  const int64_t L0 = static_cast<const int32_t*>(cache.lengths.data)[b * cache.lengths.strides[0]];
  int64_t c = static_cast<const int32_t*>(cache.ckpt.data)[b * cache.ckpt.strides[0]];
  const RowView K = rows_of(cache.k, b, h), V = rows_of(cache.v, b, h);
  // M = H_c ... H_{t-1}, row d at M.row(d) (element stride M.es).
  const RowView M{static_cast<float*>(cache.carry.data) + offset(cache.carry, b, h), cache.carry.strides[2],
                  cache.carry.strides[3]};
  const RowView Q = rows_of(in.q, b, 0), Kin = rows_of(in.k, b, h), Vin = rows_of(in.v, b, h), Win = rows_of(in.w, b, h);
  std::vector<float> qt(D), qc(D), mw(D), row(D), logit, o(DV);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t = L0 + s;  // the new token's position; rows [0, t) are cached
    const float* wt = Win.row(s);
    const float bt = static_cast<float>(load(in.beta, offset(in.beta, b, s, h)));
    // M <- M H_t = M - beta_t (M w_t) w_t^T (Eq. 37): now H_c ... H_t. With nothing pending (t == c) the stored
    // M is stale (the last refresh leaves it, as the GPU's must: its blocks are still reading it) and means I.
    if (t == c)
      for (int64_t d = 0; d < D; ++d)
        for (int64_t e = 0; e < D; ++e) M.row(d)[e * M.es] = d == e ? 1.f : 0.f;
    for (int64_t d = 0; d < D; ++d) mw[d] = bt * dot(M.row(d), M.es, wt, Win.es, D);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t e = 0; e < D; ++e) M.row(d)[e * M.es] -= mw[d] * wt[e * Win.es];
    // The recent rows [c, t) are carried to t - 1: carry them over H_t (Eq. 3).
    for (int64_t j = c; j < t; ++j) householder(K.row(j), K.es, wt, Win.es, bt, D);
    logit.resize(t + 1);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t hq = h * G + g;
      const float* q = Q.row(s) + hq * in.q.strides[2];
      for (int64_t d = 0; d < D; ++d) qt[d] = q[d * Q.es];
      // The query carried back to the checkpoint: H_c ... H_t q_t = M q_t (Eq. 35).
      for (int64_t d = 0; d < D; ++d) qc[d] = dot(M.row(d), M.es, qt.data(), 1, D);
      double Gt = 0.0;  // G_t continues from the last cached G (Eq. 2)
      if (p.has_gate) {
        Gt = (t > 0 ? load(cache.gcum, offset(cache.gcum, b, t - 1, hq)) : 0.0) + load(in.g, offset(in.g, b, s, hq));
        store(cache.gcum, offset(cache.gcum, b, t, hq), Gt);  // the new row's G_t joins the cache
      }
      float mx = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        const float* kj = j < t ? K.row(j) : Kin.row(s);
        const int64_t ks = j < t ? K.es : Kin.es;
        const float* qq = j < c ? qc.data() : qt.data();  // old rows: the carried-back query; recent and self: q_t
        float l = static_cast<float>(p.scale) * dot(qq, 1, kj, ks, D);
        if (p.has_gate && j < t) l += static_cast<float>(Gt - load(cache.gcum, offset(cache.gcum, b, j, hq)));
        logit[j] = l;
        mx = std::fmax(mx, l);
      }
      float sum = 0.f;
      for (float& d : o) d = 0.f;
      for (int64_t j = 0; j <= t; ++j) {
        const float e = std::exp(logit[j] - mx);
        sum += e;
        const float* vj = j < t ? V.row(j) : Vin.row(s);
        const int64_t vs = j < t ? V.es : Vin.es;
        for (int64_t d = 0; d < DV; ++d) o[d] += e * vj[d * vs];
      }
      const RowView O = rows_of(out.o, b, hq);
      for (int64_t d = 0; d < DV; ++d) O.row(s)[d * O.es] = o[d] / sum;
      store(out.lse, offset(out.lse, b, s, hq), static_cast<double>(mx) + std::log(static_cast<double>(sum)));
    }
    // Append k_t, v_t.
    for (int64_t d = 0; d < D; ++d) K.row(t)[d * K.es] = Kin.row(s)[d * Kin.es];
    for (int64_t d = 0; d < DV; ++d) V.row(t)[d * V.es] = Vin.row(s)[d * Vin.es];
    // P pending tokens: carry the old rows by M^T = H_t ... H_c (Eq. 36); the checkpoint moves to t + 1 (M, now
    // stale, is reset by the next token).
    if (refresh_due(t, c, P)) {
      for (int64_t j = 0; j < c; ++j) {
        float* kj = K.row(j);
        for (int64_t e = 0; e < D; ++e) {
          float acc = 0.f;
          for (int64_t d = 0; d < D; ++d) acc += M.row(d)[e * M.es] * kj[d * K.es];
          row[e] = acc;
        }
        for (int64_t e = 0; e < D; ++e) kj[e * K.es] = row[e];
      }
      c = t + 1;
    }
  }
}

}  // namespace

void decode_checkpointed(const Problem& p, const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out) {
  if (p.T > 0) parallel_for(p.B * p.H, [&](int64_t i) { decode_head(p, in, cache, out, i / p.H, i % p.H); });
  // Every head of a sequence moved its checkpoint at the same tokens: the same rule here.
  int32_t* len = static_cast<int32_t*>(cache.lengths.data);
  int32_t* ck = static_cast<int32_t*>(cache.ckpt.data);
  for (int64_t b = 0; b < p.B; ++b) {
    int64_t c = ck[b * cache.ckpt.strides[0]];
    const int64_t L0 = len[b * cache.lengths.strides[0]];
    for (int64_t t = L0; t < L0 + p.T; ++t)
      if (refresh_due(t, c, cache.ckpt_period)) c = t + 1;
    ck[b * cache.ckpt.strides[0]] = static_cast<int32_t>(c);
    len[b * cache.lengths.strides[0]] = static_cast<int32_t>(L0 + p.T);
  }
}

}  // namespace pathattn::cpu
