// The fast CPU backward (docs/math.md Eq. 18-30), in three stages, extra memory linear in T:
//   1. per (sequence, kv head): gather, every chunk's UT factors, Qhat, Khat, delta = rowsum(dO o)   (Eq. 18)
//   2. per (sequence, kv head, key chunk c), in parallel: carry K^_c forward through the later chunks
//      (keeping only this chunk's carried copies, T x D), then walk the query chunks back, recomputing the
//      probabilities, and carry the key gradient back through each chunk's UT factor (Eq. 19-23);
//   3. per (sequence, kv head): sum the per-thread accumulators, intra-chunk attention and chunk-local
//      backward (Eq. 24-30), the gate's reverse cumulative sum, scatter.
// Nothing of size T^2 is stored: fla's backward keeps the query transformed to every 512-token boundary
// (T^2 / 512 memory); here stage 2 recomputes instead.
// From 16 chunks on the chunks are grouped into blocks (the two-level carry, docs/math.md Eq. 47-50; block_chunks):
// a pair of chunks in different blocks sees the key carried once per block between them (block_carry.h) and the
// query carried back to its block's start, so stage 2 makes one D x D step per block instead of one step per chunk
// there. Pairs inside a block, and every pair of a shorter sequence, go through the per-chunk chain (Eq. 18-23).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/env.h"
#include "cpu/block_carry.h"
#include "cpu/chunk.h"
#include "cpu/cpu.h"
#include "cpu/gemm.h"
#include "cpu/head.h"

namespace pathattn::cpu {
namespace {

// What stage 1 computes for one (sequence, kv head).
struct HeadState {
  Segment seg;
  int64_t h = 0;
  HeadData x;
  int64_t B = 0;                // chunks per block (>= the chunk count: one block, the per-chunk chain only)
  std::vector<float> Pi;        // [NB, D, D] block products (Eq. 47), when there are several blocks
  std::vector<float> Qp;        // [G, L, D] queries carried back to their block's start (Eq. 48)
  std::vector<float> T, Kcorr;  // [N, C, C] per chunk (only the leading n x n used)
  std::vector<float> U, Khat;   // [L, D]
  std::vector<float> Qhat;      // [G, L, D]
  std::vector<float> dO;        // [G, L, DV]
  std::vector<float> lse, delta;  // [G, L]
  // Written by stage 2: gradients owned by the key chunk's task.
  std::vector<float> dKhat;  // [L, D]
  std::vector<float> dv;     // [L, DV]

  ChunkFactors factors(int64_t m) {
    const int64_t r0 = m * kChunk, n = std::min(kChunk, x.L - r0), D = x.D, C2 = kChunk * kChunk;
    return {n, D, &x.w[r0 * D], &x.k[r0 * D], &x.beta[r0], &T[m * C2], &U[r0 * D], &Kcorr[m * C2], &Khat[r0 * D]};
  }
  int64_t blocks() const { return (x.chunks() + B - 1) / B; }
  bool blocked() const { return blocks() > 1; }
  // The factors of chunks first .. first + count - 1, in order.
  std::vector<ChunkFactors> run(int64_t first, int64_t count) {
    std::vector<ChunkFactors> f;
    for (int64_t j = 0; j < count; ++j) f.push_back(factors(first + j));
    return f;
  }
};

// Per-thread accumulators for one head: gradients that several key chunks' tasks add to.
struct HeadAccum {
  std::vector<float> dQhat;  // [G, L, D]
  std::vector<float> dU, dW;  // [L, D] (dW: the part through the cache carries only)
  std::vector<float> dG;      // [G, L] gradient of the cumulative gate G_t
  std::vector<float> dQp;     // [G, L, D] gradient of the block-start queries Qp (several blocks only)
  std::vector<float> dPi;     // [NB, D, D] gradient of the block products (several blocks only)
};

// Chunks per block of the two-level carry for a sequence of `chunks` chunks. By default about 2/3 sqrt(chunks) from
// 16 chunks (T >= 1024) on: a key chunk's chain steps, (B - 1) / 2 + chunks / (2 B), are fewest at sqrt(chunks), and
// the query carry and block products (O(B) per chunk) pull the best a little lower. Measured on 2 cores (B 1, H 4,
// D 64, docs/perf/notes.md "A two-level carry"): the backward 340 -> 246-259 ms at T 4096 with B 4-6, 1452 -> 920 ms
// at T 8192 with B 6. Shorter sequences keep one block (the per-chunk chain: the bits of the runs recorded before).
// PATHATTN_CPU_BWD_BLOCK overrides: 0 = one block per sequence, B >= 1 = B chunks per block. Read at every call.
int64_t block_chunks(int64_t chunks) {
  const int64_t b = env::integer("PATHATTN_CPU_BWD_BLOCK", -1, 0, 1 << 20);
  const int64_t one = std::max<int64_t>(chunks, 1);
  if (b >= 0) return b == 0 ? one : b;
  return chunks < 16 ? one : std::max<int64_t>(2, std::llround(std::sqrt(static_cast<double>(chunks)) * 2.0 / 3.0));
}

HeadState stage1(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse,
                 const TensorView& dout, const TensorView& dlse, const Segment& s, int64_t h) {
  HeadState st;
  st.seg = s;
  st.h = h;
  st.x = gather_head(p, in, s, h);
  const HeadData& x = st.x;
  const int64_t L = x.L, D = x.D, DV = x.DV, G = x.G, N = x.chunks(), C = kChunk;
  st.T.resize(N * C * C);
  st.Kcorr.resize(N * C * C);
  st.U.resize(L * D);
  st.Khat.resize(L * D);
  st.Qhat.resize(G * L * D);
  st.dO.resize(G * L * DV);
  st.lse.resize(G * L);
  st.delta.assign(G * L, 0.f);
  st.dKhat.assign(L * D, 0.f);
  st.dv.assign(L * DV, 0.f);
  std::vector<float> QWl(C * C), S(C * C), orow(L * DV), dlse_row(L);
  for (int64_t m = 0; m < N; ++m) {
    ChunkFactors f = st.factors(m);
    chunk_key_side(f);
    for (int64_t j = 0; j < G; ++j)
      chunk_query_side(f, &x.q[(j * L + m * C) * D], QWl.data(), &st.Qhat[(j * L + m * C) * D], S.data());
  }
  st.B = block_chunks(N);
  if (st.blocked()) {  // Eq. 47, 48: the block products and the queries at their block's start
    const int64_t NB = st.blocks();
    st.Pi.resize(NB * D * D);
    st.Qp.resize(G * L * D);
    for (int64_t b = 0; b < NB; ++b) {
      const int64_t s0 = b * st.B, count = std::min(st.B, N - s0);
      const std::vector<ChunkFactors> f = st.run(s0, count);
      if (b + 1 < NB) block_product(f.data(), count, D, &st.Pi[b * D * D]);  // (no key is carried past the last)
      for (int64_t m = s0; b > 0 && m < s0 + count; ++m)  // (block 0's queries have no earlier block)
        for (int64_t j = 0; j < G; ++j) {
          const int64_t r = (j * L + m * C) * D;
          carry_query_to_block_start(f.data(), m - s0, &st.Qhat[r], std::min(C, L - m * C), D, &st.Qp[r]);
        }
    }
  }
  for (int64_t j = 0; j < G; ++j) {
    const int64_t hq = h * G + j;
    gather(dout, s, hq, DV, &st.dO[j * L * DV]);
    gather(o, s, hq, DV, orow.data());
    gather(lse, s, hq, 1, &st.lse[j * L]);
    if (dlse.defined()) gather(dlse, s, hq, 1, dlse_row.data());
    for (int64_t t = 0; t < L; ++t) {  // Eq. 6: delta_t = dO_t . o_t - dlse_t (d lse_t / d l_ti = P_ti)
      float acc = 0.f;
      for (int64_t d = 0; d < DV; ++d) acc += st.dO[(j * L + t) * DV + d] * orow[t * DV + d];
      st.delta[j * L + t] = dlse.defined() ? acc - dlse_row[t] : acc;
    }
  }
  return st;
}

// Probabilities of a block and their logit gradient, in place: on entry P holds scale * s for rows of query
// chunk starting r0 (query positions) against keys starting c0; on exit P = softmax probabilities and dl holds
// d loss / d l (Eq. 19-20). dP must hold dO V^T for the block.
void block_softmax_backward(float* P, float* dl, int64_t nq, int64_t nk, int64_t r0, int64_t c0, const float* lse,
                            const float* delta, const double* gcum) {
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t c = 0; c < nk; ++c) {
      float l = P[i * nk + c];
      if (gcum) l += static_cast<float>(gcum[r0 + i] - gcum[c0 + c]);
      const float pr = std::exp(l - lse[r0 + i]);
      P[i * nk + c] = pr;
      dl[i * nk + c] = pr * (dl[i * nk + c] - delta[r0 + i]);
    }
}

// Stage 2 for key chunk c of one head (Eq. 19-23; with several blocks, Eq. 49-50 past c's block).
void stage2(const Problem& p, HeadState& st, int64_t c, HeadAccum& acc) {
  const HeadData& x = st.x;
  const int64_t L = x.L, D = x.D, DV = x.DV, G = x.G, N = x.chunks(), C = kChunk;
  const int64_t c0 = c * C, nc = std::min(C, L - c0);
  if (c + 1 >= N) return;
  const float scale = static_cast<float>(p.scale);
  // Past c's block (chunks >= next) the pairs use the key carried per block, Kb[mu] = K~_{c, mu B} (Eq. 49).
  const int64_t beta = c / st.B, next = std::min((beta + 1) * st.B, N), last_chunk = std::min(next, N - 1);
  // Kt[m] = K^_c carried to the start of chunk m, m = c+1 .. last_chunk (Eq. 17), [nc, D] each.
  std::vector<float> Kt((last_chunk - c) * nc * D);
  auto kt = [&](int64_t m) { return &Kt[(m - c - 1) * nc * D]; };
  std::copy(&st.Khat[c0 * D], &st.Khat[(c0 + nc) * D], kt(c + 1));
  std::vector<float> X(nc * C), EW(nc * C), E(nc * D, 0.f), P(C * nc), dl(C * nc);
  for (int64_t m = c + 1; m < last_chunk; ++m) {
    const ChunkFactors f = st.factors(m);
    std::copy(kt(m), kt(m) + nc * D, kt(m + 1));
    gemm(false, true, nc, f.n, D, 1.f, kt(m), D, f.U, D, 0.f, X.data(), f.n);
    gemm(false, false, nc, D, f.n, -1.f, X.data(), f.n, f.w, D, 1.f, kt(m + 1), D);
  }
  const int64_t NB = st.blocks();
  std::vector<float> Kb, Eb, EPi;  // Kb[mu - beta - 1] = K~_{c, mu B}; Eb = d loss / d Kb of the current block
  auto kb = [&](int64_t mu) { return &Kb[(mu - beta - 1) * nc * D]; };
  if (next < N) {
    Kb.resize((NB - beta - 1) * nc * D);
    Eb.assign(nc * D, 0.f);
    EPi.resize(nc * D);
    std::copy(kt(next), kt(next) + nc * D, kb(beta + 1));
    for (int64_t mu = beta + 1; mu + 1 < NB; ++mu)  // Kb[mu + 1] = Kb[mu] Pi_mu^T (Eq. 49)
      gemm(false, true, nc, D, D, 1.f, kb(mu), D, &st.Pi[mu * D * D], D, 0.f, kb(mu + 1), D);
  }
  const float* Vc = &x.v[c0 * DV];
  float* dVc = &st.dv[c0 * DV];
  for (int64_t m = N - 1; m > c; --m) {
    const int64_t m0 = m * C, nm = std::min(C, L - m0), mu = m / st.B;
    const bool far = m >= next;  // in a later block: block-start frame (Eq. 49)
    const float* Km = far ? kb(mu) : kt(m);
    float* Em = far ? Eb.data() : E.data();
    for (int64_t j = 0; j < G; ++j) {
      const float* Qh = far ? &st.Qp[(j * L + m0) * D] : &st.Qhat[(j * L + m0) * D];
      float* dQh = far ? &acc.dQp[(j * L + m0) * D] : &acc.dQhat[(j * L + m0) * D];
      const float* dO = &st.dO[(j * L + m0) * DV];
      gemm(false, true, nm, nc, D, scale, Qh, D, Km, D, 0.f, P.data(), nc);
      gemm(false, true, nm, nc, DV, 1.f, dO, DV, Vc, DV, 0.f, dl.data(), nc);
      const double* gc = x.gcum.empty() ? nullptr : &x.gcum[j * L];
      block_softmax_backward(P.data(), dl.data(), nm, nc, m0, c0, &st.lse[j * L], &st.delta[j * L], gc);
      gemm(true, false, nc, DV, nm, 1.f, P.data(), nc, dO, DV, 1.f, dVc, DV);  // Eq. 5
      if (gc) {  // Eq. 7: l_ij depends on G_i - G_j
        float* dG = &acc.dG[j * L];
        for (int64_t i = 0; i < nm; ++i)
          for (int64_t k = 0; k < nc; ++k) {
            dG[m0 + i] += dl[i * nc + k];
            dG[c0 + k] -= dl[i * nc + k];
          }
      }
      // ds = scale dl: dQhat_m += ds Kt[m], E += ds^T Qhat_m (Eq. 21; in the block-start frame when far).
      gemm(false, false, nm, D, nc, scale, dl.data(), nc, Km, D, 1.f, dQh, D);
      gemm(true, false, nc, D, nm, scale, dl.data(), nc, Qh, D, 1.f, Em, D);
    }
    if (far && m != mu * st.B) continue;  // inside a later block: the same Kb for all its chunks
    if (far && mu - 1 > beta) {  // back through Kb[mu] = Kb[mu-1] Pi_{mu-1}^T (Eq. 50)
      gemm(true, false, D, D, nc, 1.f, Eb.data(), D, kb(mu - 1), D, 1.f, &acc.dPi[(mu - 1) * D * D], D);
      gemm(false, false, nc, D, D, 1.f, Eb.data(), D, &st.Pi[(mu - 1) * D * D], D, 0.f, EPi.data(), D);
      Eb.swap(EPi);
      continue;
    }
    if (far)  // m = next: Kb[beta + 1] is Kt[next], and the per-chunk chain takes over
      for (int64_t i = 0; i < nc * D; ++i) E[i] += Eb[i];
    if (m > c + 1) {  // back through Kt[m] = Kt[m-1] - X W_{m-1}, X = Kt[m-1] U_{m-1}^T (Eq. 22-23)
      const ChunkFactors f = st.factors(m - 1);
      const int64_t r = (m - 1) * C;
      gemm(false, true, nc, f.n, D, 1.f, kt(m - 1), D, f.U, D, 0.f, X.data(), f.n);
      gemm(true, false, f.n, D, nc, -1.f, X.data(), f.n, E.data(), D, 1.f, &acc.dW[r * D], D);
      gemm(false, true, nc, f.n, D, 1.f, E.data(), D, f.w, D, 0.f, EW.data(), f.n);
      gemm(true, false, f.n, D, nc, -1.f, EW.data(), f.n, kt(m - 1), D, 1.f, &acc.dU[r * D], D);
      gemm(false, false, nc, D, f.n, -1.f, EW.data(), f.n, f.U, D, 1.f, E.data(), D);
    }
  }
  std::copy(E.begin(), E.end(), &st.dKhat[c0 * D]);
}

// Stage 3 for one head (Eq. 24-30): intra-chunk attention backward, chunk-local backward, gate, scatter.
void stage3(const Problem& p, HeadState& st, std::vector<HeadAccum*>& accs, const Gradients& gr) {
  const HeadData& x = st.x;
  const int64_t L = x.L, D = x.D, DV = x.DV, G = x.G, N = x.chunks(), C = kChunk;
  const float scale = static_cast<float>(p.scale);
  HeadAccum sum{std::vector<float>(G * L * D, 0.f), std::vector<float>(L * D, 0.f), std::vector<float>(L * D, 0.f),
                std::vector<float>(G * L, 0.f), {}, {}};
  if (st.blocked()) {
    sum.dQp.assign(G * L * D, 0.f);
    sum.dPi.assign(st.blocks() * D * D, 0.f);
  }
  for (HeadAccum* a : accs) {
    if (a->dU.empty()) continue;  // this thread ran no task of this head
    for (size_t i = 0; i < sum.dQhat.size(); ++i) sum.dQhat[i] += a->dQhat[i];
    for (size_t i = 0; i < sum.dU.size(); ++i) sum.dU[i] += a->dU[i], sum.dW[i] += a->dW[i];
    for (size_t i = 0; i < sum.dG.size(); ++i) sum.dG[i] += a->dG[i];
    for (size_t i = 0; i < sum.dQp.size(); ++i) sum.dQp[i] += a->dQp[i];
    for (size_t i = 0; i < sum.dPi.size(); ++i) sum.dPi[i] += a->dPi[i];
  }
  if (st.blocked())  // Eq. 47, 48 backward: into the chunks' dW, dU and the queries' dQhat
    for (int64_t b = 0; b < st.blocks(); ++b) {
      const int64_t s0 = b * st.B, count = std::min(st.B, N - s0);
      const std::vector<ChunkFactors> f = st.run(s0, count);
      float* dW0 = &sum.dW[s0 * C * D];
      float* dU0 = &sum.dU[s0 * C * D];
      if (b + 1 < st.blocks()) block_product_backward(f.data(), count, D, &sum.dPi[b * D * D], dW0, dU0);
      for (int64_t m = s0; b > 0 && m < s0 + count; ++m)
        for (int64_t j = 0; j < G; ++j) {
          const int64_t r = (j * L + m * C) * D;
          carry_query_to_block_start_backward(f.data(), m - s0, &st.Qhat[r], &sum.dQp[r], std::min(C, L - m * C), D,
                                              &sum.dQhat[r], dW0, dU0);
        }
    }
  std::vector<float> dq(G * L * D, 0.f), dk(L * D, 0.f), dw = sum.dW, dbeta(L, 0.f);
  std::vector<float> QWl(C * C), Qh(C * D), S(C * C), dl(C * C), dKcorr(C * C);
  for (int64_t m = 0; m < N; ++m) {
    const ChunkFactors f = st.factors(m);
    const int64_t m0 = m * C, n = f.n;
    std::fill(dKcorr.begin(), dKcorr.end(), 0.f);
    float* dU = &sum.dU[m0 * D];
    for (int64_t j = 0; j < G; ++j) {
      const float* q = &x.q[(j * L + m0) * D];
      const float* dO = &st.dO[(j * L + m0) * DV];
      chunk_query_side(f, q, QWl.data(), Qh.data(), S.data());
      for (int64_t i = 0; i < n * n; ++i) S[i] *= scale;
      gemm(false, true, n, n, DV, 1.f, dO, DV, &x.v[m0 * DV], DV, 0.f, dl.data(), n);
      const double* gc = x.gcum.empty() ? nullptr : &x.gcum[j * L];
      block_softmax_backward(S.data(), dl.data(), n, n, m0, m0, &st.lse[j * L], &st.delta[j * L], gc);
      for (int64_t i = 0; i < n; ++i)  // causal mask: above the diagonal nothing flows
        for (int64_t k = i + 1; k < n; ++k) S[i * n + k] = dl[i * n + k] = 0.f;
      gemm(true, false, n, DV, n, 1.f, S.data(), n, dO, DV, 1.f, &st.dv[m0 * DV], DV);
      if (gc)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k <= i; ++k) {
            sum.dG[j * L + m0 + i] += dl[i * n + k];
            sum.dG[j * L + m0 + k] -= dl[i * n + k];
          }
      for (int64_t i = 0; i < n * n; ++i) dl[i] *= scale;
      chunk_query_side_backward(f, q, QWl.data(), &sum.dQhat[(j * L + m0) * D], dl.data(), &dq[(j * L + m0) * D],
                                &dk[m0 * D], &dw[m0 * D], dU, dKcorr.data());
    }
    chunk_key_side_backward(f, dU, dKcorr.data(), &st.dKhat[m0 * D], &dk[m0 * D], &dw[m0 * D], &dbeta[m0]);
  }
  const Segment& s = st.seg;
  for (int64_t j = 0; j < G; ++j) {
    const int64_t hq = st.h * G + j;
    scatter(&dq[j * L * D], D, gr.dq, s, hq);
    if (p.has_gate) {  // G_t = g_1 + ... + g_t, so dg_t = sum_{i >= t} dG_i (Eq. 7)
      std::vector<float> dg(L);
      double run = 0;
      for (int64_t t = L - 1; t >= 0; --t) dg[t] = static_cast<float>(run += sum.dG[j * L + t]);
      scatter_scalar(dg.data(), gr.dg, s, hq);
    }
  }
  scatter(dk.data(), D, gr.dk, s, st.h);
  scatter(st.dv.data(), DV, gr.dv, s, st.h);
  scatter(dw.data(), D, gr.dw, s, st.h);
  scatter_scalar(dbeta.data(), gr.dbeta, s, st.h);
}

}  // namespace

void backward(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const TensorView& dlse, const Gradients& grads) {
  const int64_t heads = static_cast<int64_t>(p.segments.size()) * p.H;
  std::vector<HeadState> st(heads);
  parallel_for(heads, [&](int64_t t) { st[t] = stage1(p, in, o, lse, dout, dlse, p.segments[t / p.H], t % p.H); });

  // Stage 2 tasks: (head, key chunk), longest first (chunk 0 pairs with every later chunk).
  std::vector<std::pair<int64_t, int64_t>> tasks;
  for (int64_t hd = 0; hd < heads; ++hd)
    for (int64_t c = 0; c < st[hd].x.chunks(); ++c) tasks.push_back({hd, c});
  std::stable_sort(tasks.begin(), tasks.end(), [&](auto a, auto b) {
    return st[a.first].x.chunks() - a.second > st[b.first].x.chunks() - b.second;
  });
  // Deterministic: task i always runs in slot i % slots, in order, and each slot sums into its own accumulators,
  // reduced in slot order in stage 3. So two calls with the same thread count give bitwise equal gradients (a
  // dynamic schedule made dq, dw, dbeta differ at 1e-8, which training amplified). Slots cycle through the
  // tasks sorted longest first, which balances them.
  const int64_t slots = std::min<int64_t>(num_threads(), static_cast<int64_t>(tasks.size()));
  std::vector<std::vector<HeadAccum>> acc(slots, std::vector<HeadAccum>(heads));  // allocated on first use
  parallel_for(slots, [&](int64_t slot) {
    for (size_t i = slot; i < tasks.size(); i += slots) {
      const auto [hd, c] = tasks[i];
      HeadAccum& a = acc[slot][hd];
      if (a.dU.empty()) {
        const HeadData& x = st[hd].x;
        a.dQhat.assign(x.G * x.L * x.D, 0.f);
        a.dU.assign(x.L * x.D, 0.f);
        a.dW.assign(x.L * x.D, 0.f);
        a.dG.assign(x.G * x.L, 0.f);
        if (st[hd].blocked()) {
          a.dQp.assign(x.G * x.L * x.D, 0.f);
          a.dPi.assign(st[hd].blocks() * x.D * x.D, 0.f);
        }
      }
      stage2(p, st[hd], c, a);
    }
  });

  parallel_for(heads, [&](int64_t hd) {
    std::vector<HeadAccum*> accs;
    for (int64_t t = 0; t < slots; ++t) accs.push_back(&acc[t][hd]);
    stage3(p, st[hd], accs, grads);
  });
}

}  // namespace pathattn::cpu
