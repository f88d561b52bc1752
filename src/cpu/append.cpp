#include "cpu/append.h"

#include <limits>

#include "cpu/gemm.h"
#include "cpu/softmax.h"

namespace pathattn::cpu {

void append_chunk(const Problem& p, const History& h, int64_t r0, int64_t n, const ChunkRows& c, AppendScratch& s) {
  const int64_t D = h.D, DV = h.DV, C = kChunk, r1 = r0 + n;
  const float scale = static_cast<float>(p.scale);
  for (auto* b : {&s.T, &s.Kcorr, &s.QWl, &s.S}) b->resize(C * C);
  for (auto* b : {&s.U, &s.Khat, &s.Qhat}) b->resize(C * D);
  s.logits.resize(n * r1);  // [n, r1]
  s.X.resize(r0 * n);       // [r0, n]
  ChunkFactors f{n, D, c.w, c.k, c.beta, s.T.data(), s.U.data(), s.Kcorr.data(), s.Khat.data()};
  chunk_key_side(f);
  for (int64_t j = 0; j < h.G; ++j) {
    chunk_query_side(f, c.q + j * c.qstride, s.QWl.data(), s.Qhat.data(), s.S.data());
    // Logits against the carried cache (Eq. 15, 17) and within the chunk (Eq. 12).
    float* l = s.logits.data();
    gemm(false, true, n, r0, D, scale, s.Qhat.data(), D, h.cache, D, 0.f, l, r1);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < n; ++k)
        l[i * r1 + r0 + k] = k <= i ? scale * s.S[i * n + k] : -std::numeric_limits<float>::infinity();
    softmax_rows(l, n, r1, r1, h.gcum ? h.gcum + j * h.gstride : nullptr, r0, c.lse + j * c.lstride);
    gemm(false, false, n, DV, r1, 1.f, l, r1, h.v, DV, 0.f, c.o + j * c.ostride, DV);
  }
  // Carry the cache over this chunk (Eq. 17): K~ <- K~ - (K~ U^T) W, then append Khat. A multi-token decoding
  // step thus updates the cache once with the chunk's UT factor instead of n rank-one updates (docs/spec.md §4).
  if (r0 > 0) {
    gemm(false, true, r0, n, D, 1.f, h.cache, D, s.U.data(), D, 0.f, s.X.data(), n);
    gemm(false, false, r0, D, n, -1.f, s.X.data(), n, c.w, D, 1.f, h.cache, D);
  }
  std::copy(s.Khat.begin(), s.Khat.begin() + n * D, h.cache + r0 * D);
}

}  // namespace pathattn::cpu
