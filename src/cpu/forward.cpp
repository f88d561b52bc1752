// The fast CPU forward: chunks in order, keys carried in a cache (docs/math.md Eq. 17), f32 GEMMs.
// Per (sequence, kv head): O(T^2 (2D + DV)) work, O(T D + C T) memory.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/chunk.h"
#include "cpu/cpu.h"
#include "cpu/gemm.h"
#include "cpu/head.h"
#include "cpu/softmax.h"

namespace pathattn::cpu {
namespace {

void forward_head(const Problem& p, const Inputs& in, const Segment& s, int64_t h, const ForwardOutputs& out) {
  const HeadData x = gather_head(p, in, s, h);
  const int64_t L = x.L, D = x.D, DV = x.DV, C = kChunk;
  const float scale = static_cast<float>(p.scale);
  std::vector<float> cache(L * D);  // [L, D] keys of finished chunks, carried to the current chunk start
  std::vector<float> T(C * C), U(C * D), Kcorr(C * C), Khat(C * D), QWl(C * C), Qhat(C * D), S(C * C);
  std::vector<float> logits(C * L), X(L * C);  // [n, r1] one chunk's logits; [r0, n] cache update scratch
  std::vector<float> o(x.G * L * DV), lse(x.G * L);  // [G, L, DV], [G, L]
  for (int64_t r0 = 0; r0 < L; r0 += C) {
    const int64_t n = std::min(C, L - r0), r1 = r0 + n;
    ChunkFactors f{n, D, &x.w[r0 * D], &x.k[r0 * D], &x.beta[r0], T.data(), U.data(), Kcorr.data(), Khat.data()};
    chunk_key_side(f);
    for (int64_t j = 0; j < x.G; ++j) {
      chunk_query_side(f, &x.q[(j * L + r0) * D], QWl.data(), Qhat.data(), S.data());
      // Logits against the carried cache (Eq. 15, 17) and within the chunk (Eq. 12).
      gemm(false, true, n, r0, D, scale, Qhat.data(), D, cache.data(), D, 0.f, logits.data(), r1);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < n; ++c)
          logits[i * r1 + r0 + c] = c <= i ? scale * S[i * n + c] : -std::numeric_limits<float>::infinity();
      const double* gc = x.gcum.empty() ? nullptr : &x.gcum[j * L];
      float* oj = &o[(j * L + r0) * DV];
      softmax_rows(logits.data(), n, r1, r1, gc, r0, &lse[j * L + r0]);
      gemm(false, false, n, DV, r1, 1.f, logits.data(), r1, x.v.data(), DV, 0.f, oj, DV);
    }
    // Carry the cache over this chunk (Eq. 17): K~ <- K~ - (K~ U^T) W, then append Khat.
    if (r0 > 0) {
      gemm(false, true, r0, n, D, 1.f, cache.data(), D, U.data(), D, 0.f, X.data(), n);
      gemm(false, false, r0, D, n, -1.f, X.data(), n, &x.w[r0 * D], D, 1.f, cache.data(), D);
    }
    std::copy(Khat.begin(), Khat.begin() + n * D, cache.begin() + r0 * D);
  }
  for (int64_t j = 0; j < x.G; ++j) {
    scatter(&o[j * L * DV], DV, out.o, s, h * x.G + j);
    scatter_scalar(&lse[j * L], out.lse, s, h * x.G + j);
  }
  if (out.kcache.defined()) scatter(cache.data(), D, out.kcache, s, h);
}

}  // namespace

void forward(const Problem& p, const Inputs& in, const ForwardOutputs& out) {
  const int64_t tasks = static_cast<int64_t>(p.segments.size()) * p.H;
  parallel_for(tasks, [&](int64_t t) { forward_head(p, in, p.segments[t / p.H], t % p.H, out); });
}

}  // namespace pathattn::cpu
