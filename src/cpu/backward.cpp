// The fast CPU backward (docs/math.md Eq. 18-30), in three stages, extra memory linear in T:
//   1. per (sequence, kv head): gather, every chunk's UT factors, Qhat, Khat, delta = rowsum(dO o)   (Eq. 18)
//   2. per (sequence, kv head, key chunk c), in parallel: carry K^_c forward through the later chunks
//      (keeping only this chunk's carried copies, T x D), then walk the query chunks back, recomputing the
//      probabilities, and carry the key gradient back through each chunk's UT factor (Eq. 19-23);
//   3. per (sequence, kv head): sum the per-thread accumulators, intra-chunk attention and chunk-local
//      backward (Eq. 24-30), the gate's reverse cumulative sum, scatter.
// Nothing of size T^2 is stored: fla's backward keeps the query transformed to every 512-token boundary
// (T^2 / 512 memory); here stage 2 recomputes instead.
#include <cmath>
#include <vector>

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
};

// Per-thread accumulators for one head: gradients that several key chunks' tasks add to.
struct HeadAccum {
  std::vector<float> dQhat;  // [G, L, D]
  std::vector<float> dU, dW;  // [L, D] (dW: the part through the cache carries only)
  std::vector<float> dG;      // [G, L] gradient of the cumulative gate G_t
};

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

// Stage 2 for key chunk c of one head (Eq. 19-23).
void stage2(const Problem& p, HeadState& st, int64_t c, HeadAccum& acc) {
  const HeadData& x = st.x;
  const int64_t L = x.L, D = x.D, DV = x.DV, G = x.G, N = x.chunks(), C = kChunk;
  const int64_t c0 = c * C, nc = std::min(C, L - c0);
  if (c + 1 >= N) return;
  const float scale = static_cast<float>(p.scale);
  // Kt[m] = K^_c carried to the start of chunk m, m = c+1 .. N-1 (Eq. 17), [nc, D] each.
  std::vector<float> Kt((N - c - 1) * nc * D);
  auto kt = [&](int64_t m) { return &Kt[(m - c - 1) * nc * D]; };
  std::copy(&st.Khat[c0 * D], &st.Khat[(c0 + nc) * D], kt(c + 1));
  std::vector<float> X(nc * C), EW(nc * C), E(nc * D, 0.f), P(C * nc), dl(C * nc);
  for (int64_t m = c + 1; m + 1 < N; ++m) {
    const ChunkFactors f = st.factors(m);
    std::copy(kt(m), kt(m) + nc * D, kt(m + 1));
    gemm(false, true, nc, f.n, D, 1.f, kt(m), D, f.U, D, 0.f, X.data(), f.n);
    gemm(false, false, nc, D, f.n, -1.f, X.data(), f.n, f.w, D, 1.f, kt(m + 1), D);
  }
  const float* Vc = &x.v[c0 * DV];
  float* dVc = &st.dv[c0 * DV];
  for (int64_t m = N - 1; m > c; --m) {
    const int64_t m0 = m * C, nm = std::min(C, L - m0);
    for (int64_t j = 0; j < G; ++j) {
      const float* Qh = &st.Qhat[(j * L + m0) * D];
      const float* dO = &st.dO[(j * L + m0) * DV];
      gemm(false, true, nm, nc, D, scale, Qh, D, kt(m), D, 0.f, P.data(), nc);
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
      // ds = scale dl: dQhat_m += ds Kt[m], E += ds^T Qhat_m (Eq. 21).
      gemm(false, false, nm, D, nc, scale, dl.data(), nc, kt(m), D, 1.f, &acc.dQhat[(j * L + m0) * D], D);
      gemm(true, false, nc, D, nm, scale, dl.data(), nc, Qh, D, 1.f, E.data(), D);
    }
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
                std::vector<float>(G * L, 0.f)};
  for (HeadAccum* a : accs) {
    if (a->dU.empty()) continue;  // this thread ran no task of this head
    for (size_t i = 0; i < sum.dQhat.size(); ++i) sum.dQhat[i] += a->dQhat[i];
    for (size_t i = 0; i < sum.dU.size(); ++i) sum.dU[i] += a->dU[i], sum.dW[i] += a->dW[i];
    for (size_t i = 0; i < sum.dG.size(); ++i) sum.dG[i] += a->dG[i];
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
