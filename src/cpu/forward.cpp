// The fast CPU forward: chunks in order, keys carried in a cache (docs/math.md Eq. 17), f32 GEMMs.
// Per (sequence, kv head): O(T^2 (2D + DV)) work, O(T D + C T) memory.
#include <vector>

#include "cpu/append.h"
#include "cpu/cpu.h"
#include "cpu/head.h"

namespace pathattn::cpu {
namespace {

void forward_head(const Problem& p, const Inputs& in, const Segment& s, int64_t h, const ForwardOutputs& out) {
  const HeadData x = gather_head(p, in, s, h);
  const int64_t L = x.L, D = x.D, DV = x.DV;
  std::vector<float> cache(L * D);                   // [L, D] keys carried to the current chunk start
  std::vector<float> o(x.G * L * DV), lse(x.G * L);  // [G, L, DV], [G, L]
  const History hist{D, DV, x.G, cache.data(), x.v.data(), x.gcum.empty() ? nullptr : x.gcum.data(), L};
  AppendScratch scratch;
  for (int64_t r0 = 0; r0 < L; r0 += kChunk) {
    const ChunkRows rows{&x.q[r0 * D], L * D,     &x.k[r0 * D], &x.w[r0 * D], &x.beta[r0],
                         &o[r0 * DV],  L * DV,    &lse[r0],     L};
    append_chunk(p, hist, r0, std::min(kChunk, L - r0), rows, scratch);
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
