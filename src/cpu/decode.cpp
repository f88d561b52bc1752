// Decoding on the CPU: the new tokens of each (sequence, kv head) go through append_chunk against the cached
// history, exactly as the forward's chunks do, so decode and forward agree to rounding by construction.
#include <vector>

#include "cpu/append.h"
#include "cpu/cpu.h"
#include "cpu/head.h"

namespace pathattn::cpu {
namespace {

void decode_head(const Problem& p, const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out, int64_t b,
                 int64_t h, bool commit) {
  const int64_t D = p.D, DV = p.DV, G = p.group, S = p.T;
  const int64_t L0 = static_cast<const int32_t*>(cache.lengths.data)[b * cache.lengths.strides[0]], L = L0 + S;
  const Segment old{b, 0, L0}, fresh{b, 0, S}, all{b, 0, L}, tail{b, L0, S};
  // History [L, ...]: cached rows [0, L0), then the new tokens' values and gates.
  std::vector<float> keys(L * D), v(L * DV), q(G * S * D), k(S * D), w(S * D), beta(S), o(G * S * DV), lse(G * S);
  gather(cache.k, old, h, D, keys.data());
  gather(cache.v, old, h, DV, v.data());
  gather(in.v, fresh, h, DV, &v[L0 * DV]);
  gather(in.k, fresh, h, D, k.data());
  gather(in.w, fresh, h, D, w.data());
  gather(in.beta, fresh, h, 1, beta.data());
  std::vector<double> gcum(p.has_gate ? G * L : 0);
  for (int64_t j = 0; j < G; ++j) {
    const int64_t hq = h * G + j;
    gather(in.q, fresh, hq, D, &q[j * S * D]);
    if (!p.has_gate) continue;
    for (int64_t t = 0; t < L0; ++t) gcum[j * L + t] = load(cache.gcum, offset(cache.gcum, b, t, hq));
    double acc = L0 > 0 ? gcum[j * L + L0 - 1] : 0.0;  // G continues from the last cached token (Eq. 2)
    for (int64_t t = 0; t < S; ++t) gcum[j * L + L0 + t] = (acc += load(in.g, offset(in.g, b, t, hq)));
  }
  const History hist{D, DV, G, keys.data(), v.data(), p.has_gate ? gcum.data() : nullptr, L};
  AppendScratch scratch;
  for (int64_t t0 = 0; t0 < S; t0 += kChunk) {
    const ChunkRows rows{&q[t0 * D], S * D, &k[t0 * D], &w[t0 * D], &beta[t0], &o[t0 * DV], S * DV, &lse[t0], S};
    append_chunk(p, hist, L0 + t0, std::min(kChunk, S - t0), rows, scratch);
  }
  if (commit) {  // the history was a copy: without commit the cache is left as it was
    scatter(keys.data(), D, cache.k, all, h);
    scatter(&v[L0 * DV], DV, cache.v, tail, h);
  }
  for (int64_t j = 0; j < G; ++j) {
    const int64_t hq = h * G + j;
    scatter(&o[j * S * DV], DV, out.o, fresh, hq);
    scatter_scalar(&lse[j * S], out.lse, fresh, hq);
    if (p.has_gate && commit)
      for (int64_t t = 0; t < S; ++t) store(cache.gcum, offset(cache.gcum, b, L0 + t, hq), gcum[j * L + L0 + t]);
  }
}

}  // namespace

void decode(const Problem& p, const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out, bool commit) {
  if (p.T > 0) parallel_for(p.B * p.H, [&](int64_t t) { decode_head(p, in, cache, out, t / p.H, t % p.H, commit); });
  if (!commit) return;
  int32_t* len = static_cast<int32_t*>(cache.lengths.data);
  for (int64_t b = 0; b < p.B; ++b) len[b * cache.lengths.strides[0]] += static_cast<int32_t>(p.T);
}

}  // namespace pathattn::cpu
