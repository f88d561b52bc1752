#include "path_attention_torch.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace pathattn::model {
namespace {

std::string shape_str(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

void expect(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument("path_attention: " + msg);
}

// [B, T, X, Y] -> [B, X, T, Y], padded with zeros to Tp positions. Zero padding is harmless: a padded
// position has w = 0 and beta = 0 (H = I) and lies after every real position, so the causal mask hides it.
torch::Tensor to_heads(const torch::Tensor& x, int64_t pad) {
  auto y = x.transpose(1, 2);
  return pad ? torch::constant_pad_nd(y, {0, 0, 0, pad}) : y;
}

}  // namespace

void check_path_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& w, const torch::Tensor& beta, const std::optional<torch::Tensor>& g) {
  expect(q.dim() == 4, "q must be [B, T, HQ, D], got " + shape_str(q));
  const int64_t B = q.size(0), T = q.size(1), HQ = q.size(2), D = q.size(3);
  expect(k.dim() == 4 && k.size(0) == B && k.size(1) == T && k.size(3) == D,
         "k must be [B, T, H, D] = [" + std::to_string(B) + ", " + std::to_string(T) + ", H, " +
             std::to_string(D) + "], got " + shape_str(k));
  const int64_t H = k.size(2);
  expect(H > 0 && HQ % H == 0, "q heads (" + std::to_string(HQ) + ") must be a multiple of k heads (" +
                                   std::to_string(H) + ")");
  expect(w.sizes() == k.sizes(), "w must have k's shape " + shape_str(k) + ", got " + shape_str(w));
  expect(v.dim() == 4 && v.size(0) == B && v.size(1) == T && v.size(2) == H,
         "v must be [B, T, H, DV], got " + shape_str(v));
  expect(beta.dim() == 3 && beta.size(0) == B && beta.size(1) == T && beta.size(2) == H,
         "beta must be [B, T, H], got " + shape_str(beta));
  if (g) {
    expect(g->dim() == 3 && g->size(0) == B && g->size(1) == T && g->size(2) == HQ,
           "g must be [B, T, HQ], got " + shape_str(*g));
  }
}

PathAttentionTorchOut path_attention_chunked(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v, const torch::Tensor& w,
                                             const torch::Tensor& beta, const std::optional<torch::Tensor>& g,
                                             std::optional<double> scale, bool with_kcache, int64_t chunk) {
  using torch::indexing::Slice;
  check_path_inputs(q, k, v, w, beta, g);
  const int64_t B = q.size(0), T = q.size(1), HQ = q.size(2), D = q.size(3), H = k.size(2), DV = v.size(3);
  const int64_t rep = HQ / H;
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t C = std::min<int64_t>(chunk, T);
  const int64_t N = (T + C - 1) / C, Tp = N * C, pad = Tp - T;
  auto opts = q.options();

  // Chunk views. Kv-head quantities first (the key cache is per kv head), query heads after.
  auto Wc = to_heads(w.to(q.scalar_type()), pad).reshape({B, H, N, C, D});  // [B, H, N, C, D]
  auto Kc = to_heads(k, pad).reshape({B, H, N, C, D});                      // [B, H, N, C, D]
  auto bc = to_heads(beta.unsqueeze(-1), pad).reshape({B, H, N, C}).to(q.scalar_type());  // [B, H, N, C]
  auto eyeC = torch::eye(C, opts);
  auto eyeD = torch::eye(D, opts);

  // Eq. 10: A = strict_lower(b W W^T), T = (I + A)^-1, U = T b W.
  auto A = (bc.unsqueeze(-1) * Wc.matmul(Wc.transpose(-1, -2))).tril(-1);            // [B, H, N, C, C]
  auto Tm = torch::linalg_solve_triangular(eyeC + A, eyeC.expand_as(A), /*upper=*/false, /*left=*/true,
                                           /*unitriangular=*/true);                   // [B, H, N, C, C]
  auto Tb = Tm * bc.unsqueeze(-2);                                                    // T b
  auto U = Tb.matmul(Wc);                                                             // [B, H, N, C, D]
  auto X = Tb.matmul(Wc.matmul(Kc.transpose(-1, -2)).tril(-1));                       // T b strict_lower(W K^T)
  auto Khat = Kc - X.transpose(-1, -2).matmul(Wc);                                    // Eq. 14, [B, H, N, C, D]
  auto P = eyeD - Wc.transpose(-1, -2).matmul(U);                                     // Eq. 11, [B, H, N, D, D]

  PathAttentionTorchOut out;
  if (with_kcache) {
    // Suffix products: chunk c's keys carried to the end are K^_c (P_{N-1} ... P_{c+1})^T.
    std::vector<torch::Tensor> ends(N);
    auto S = eyeD.expand({B, H, D, D});
    for (int64_t c = N - 1; c >= 0; --c) {
      ends[c] = Khat.select(2, c).matmul(S.transpose(-1, -2));  // [B, H, C, D]
      S = S.matmul(P.select(2, c));
    }
    out.kcache = torch::cat(ends, 2).index({Slice(), Slice(), Slice(0, T)}).transpose(1, 2);  // [B, T, H, D]
  }

  auto rep_heads = [&](const torch::Tensor& x) { return rep == 1 ? x : x.repeat_interleave(rep, 1); };
  auto Wq = rep_heads(Wc), Kq = rep_heads(Kc), Uq = rep_heads(U), Xq = rep_heads(X), Khq = rep_heads(Khat);
  auto Pq = rep_heads(P);
  auto Qc = to_heads(q, pad).reshape({B, HQ, N, C, D});  // [B, HQ, N, C, D]

  auto QW = Qc.matmul(Wq.transpose(-1, -2)).tril();                                  // lower(Q W^T)
  auto Qhat = Qc - QW.matmul(Uq);                                                    // Eq. 13
  auto intra = Qc.matmul(Kq.transpose(-1, -2)).tril() - QW.matmul(Xq);              // Eq. 12, [B, HQ, N, C, C]

  // Eq. 15 by distance d = m - c between query chunk m and key chunk c: blocks[d][m] holds the (m, m - d)
  // block; keys are carried one chunk further per distance (Eq. 17, all key chunks at once).
  std::vector<torch::Tensor> blocks{intra};
  auto Kcar = Khq.index({Slice(), Slice(), Slice(0, N - 1)});  // key chunks 0..N-2 carried to their ends
  for (int64_t d = 1; d < N; ++d) {
    auto blk = Qhat.index({Slice(), Slice(), Slice(d, N)}).matmul(Kcar.transpose(-1, -2));  // [B,HQ,N-d,C,C]
    blocks.push_back(torch::constant_pad_nd(blk, {0, 0, 0, 0, d, 0}));
    if (d + 1 < N) {
      Kcar = Kcar.index({Slice(), Slice(), Slice(0, N - d - 1)})
                 .matmul(Pq.index({Slice(), Slice(), Slice(d, N - 1)}).transpose(-1, -2));
    }
  }
  auto Y = torch::stack(blocks, 3);  // [B, HQ, N(m), N(d), C, C]
  auto idx_opts = torch::TensorOptions().dtype(torch::kLong).device(q.device());
  auto m_idx = torch::arange(N, idx_opts).unsqueeze(1).expand({N, N});
  auto d_idx = (m_idx - torch::arange(N, idx_opts).unsqueeze(0)).clamp_min(0);
  auto S = Y.index({Slice(), Slice(), m_idx, d_idx})  // [B, HQ, N(m), N(c), C, C]
               .permute({0, 1, 2, 4, 3, 5})
               .reshape({B, HQ, Tp, Tp})
               .index({Slice(), Slice(), Slice(0, T), Slice(0, T)});  // [B, HQ, T, T]

  const auto acc = q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;  // softmax in f32 at least
  auto logits = S.to(acc) * sc;
  if (g) {
    auto G = g->to(acc).cumsum(1).transpose(1, 2);  // [B, HQ, T]
    logits = logits + (G.unsqueeze(-1) - G.unsqueeze(-2));
  }
  auto causal = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  logits = logits.masked_fill(causal, -std::numeric_limits<float>::infinity());
  auto p = torch::softmax(logits, -1).to(v.scalar_type());
  auto Vq = rep_heads(v.transpose(1, 2));            // [B, HQ, T, DV]
  out.o = p.matmul(Vq).transpose(1, 2).contiguous();  // [B, T, HQ, DV]
  (void)DV;
  return out;
}

torch::Tensor path_attention_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const torch::Tensor& w, const torch::Tensor& beta,
                                       const std::optional<torch::Tensor>& g, std::optional<double> scale) {
  check_path_inputs(q, k, v, w, beta, g);
  const int64_t T = q.size(1), HQ = q.size(2), D = q.size(3), H = k.size(2);
  const int64_t rep = HQ / H;
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  // Eq. 3: the cache holds c_j^(t) = H_t ... H_{j+1} k_j, one kv head per column of dim 2.
  auto ktr = k.transpose(1, 2);      // [B, H, T, D]
  auto wtr = w.to(q.scalar_type()).transpose(1, 2);
  auto btr = beta.to(q.scalar_type()).transpose(1, 2);  // [B, H, T]
  auto vq = v.transpose(1, 2).repeat_interleave(rep, 1);  // [B, HQ, T, DV]
  auto qtr = q.transpose(1, 2);      // [B, HQ, T, D]
  torch::Tensor G;
  if (g) G = g->to(q.scalar_type()).cumsum(1).transpose(1, 2);  // [B, HQ, T]
  std::vector<torch::Tensor> outs;
  torch::Tensor cache;  // [B, H, t, D]
  for (int64_t t = 0; t < T; ++t) {
    auto wt = wtr.select(2, t).unsqueeze(2);   // [B, H, 1, D]
    auto bt = btr.select(2, t).unsqueeze(-1).unsqueeze(-1);  // [B, H, 1, 1]
    if (cache.defined()) cache = cache - bt * (cache * wt).sum(-1, true) * wt;  // H_t applied to old keys
    auto kt = ktr.select(2, t).unsqueeze(2);
    cache = cache.defined() ? torch::cat({cache, kt}, 2) : kt;
    auto cq = cache.repeat_interleave(rep, 1);                                  // [B, HQ, t+1, D]
    auto l = (cq * qtr.select(2, t).unsqueeze(2)).sum(-1) * sc;                 // [B, HQ, t+1], Eq. 4
    if (g) {
      auto Gs = G.narrow(2, 0, t + 1);
      l = l + (G.select(2, t).unsqueeze(-1) - Gs);
    }
    auto p = torch::softmax(l, -1);
    outs.push_back((p.unsqueeze(-1) * vq.narrow(2, 0, t + 1)).sum(2));  // [B, HQ, DV]
  }
  return torch::stack(outs, 1);  // [B, T, HQ, DV]
}

}  // namespace pathattn::model
