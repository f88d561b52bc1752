// The reference against the definition: an explicit D x D product per (i, j) (Eq. 1), and its gradients
// against central finite differences, all in f64.
#include <gtest/gtest.h>

#include "harness.h"
#include "tolerances.h"

namespace pathattn::test {
namespace {

// o, lse by brute force: s_ij = q_i^T (H_i ... H_{j+1}) k_j with the product formed explicitly (docs/spec.md §1).
void brute_force(const Problem64& P, std::vector<double>& o, std::vector<double>& lse) {
  const Spec& s = P.spec;
  const int64_t D = s.D, DV = s.DV, G = s.HQ / s.H;
  o.assign(s.B * s.T * s.HQ * DV, 0.0);
  lse.assign(s.B * s.T * s.HQ, 0.0);
  std::vector<std::pair<int64_t, int64_t>> segs;  // (b, t0, len) flattened
  std::vector<int64_t> starts, lens, bs;
  if (!P.cu.empty()) {
    for (size_t n = 0; n + 1 < P.cu.size(); ++n) {
      bs.push_back(0);
      starts.push_back(P.cu[n]);
      lens.push_back(P.cu[n + 1] - P.cu[n]);
    }
  } else {
    for (int64_t b = 0; b < s.B; ++b) {
      bs.push_back(b);
      starts.push_back(0);
      lens.push_back(s.T);
    }
  }
  for (size_t n = 0; n < bs.size(); ++n)
    for (int64_t hq = 0; hq < s.HQ; ++hq) {
      const int64_t h = hq / G, b = bs[n], t0 = starts[n], L = lens[n];
      auto row = [&](int64_t t, int64_t heads, int64_t hh, int64_t dim) { return ((b * s.T + t0 + t) * heads + hh) * dim; };
      for (int64_t i = 0; i < L; ++i) {
        // M = H_i H_{i-1} ... H_{j+1}, built up as j goes down from i.
        std::vector<double> M(D * D, 0.0), l(i + 1);
        for (int64_t d = 0; d < D; ++d) M[d * D + d] = 1.0;
        double Gi = 0;
        std::vector<double> Gc(L, 0.0);
        if (s.gate) {
          double acc = 0;
          for (int64_t t = 0; t < L; ++t) Gc[t] = (acc += P.g[(b * s.T + t0 + t) * s.HQ + hq]);
          Gi = Gc[i];
        }
        for (int64_t j = i; j >= 0; --j) {
          if (j < i) {  // M <- M H_{j+1}
            const double* w = &P.w[row(j + 1, s.H, h, D)];
            const double bt = P.beta[(b * s.T + t0 + j + 1) * s.H + h];
            std::vector<double> Mw(D, 0.0);
            for (int64_t r = 0; r < D; ++r)
              for (int64_t c = 0; c < D; ++c) Mw[r] += M[r * D + c] * w[c];
            for (int64_t r = 0; r < D; ++r)
              for (int64_t c = 0; c < D; ++c) M[r * D + c] -= bt * Mw[r] * w[c];
          }
          const double* q = &P.q[row(i, s.HQ, hq, D)];
          const double* k = &P.k[row(j, s.H, h, D)];
          double sij = 0;
          for (int64_t r = 0; r < D; ++r)
            for (int64_t c = 0; c < D; ++c) sij += q[r] * M[r * D + c] * k[c];
          const double scale = 1.0 / std::sqrt(double(D));
          l[j] = scale * sij + (s.gate ? Gi - Gc[j] : 0.0);
        }
        double m = -INFINITY, sum = 0;
        for (double x : l) m = std::max(m, x);
        for (double& x : l) sum += (x = std::exp(x - m));
        for (int64_t d = 0; d < DV; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += l[j] * P.v[row(j, s.H, h, DV) + d];
          o[row(i, s.HQ, hq, DV) + d] = acc / sum;
        }
        lse[(b * s.T + t0 + i) * s.HQ + hq] = m + std::log(sum);
      }
    }
}

class RefVsBruteForce : public ::testing::TestWithParam<Spec> {};

TEST_P(RefVsBruteForce, OutputAndLse) {
  Problem64 P(GetParam());
  Case<double> r(P);
  r.forward(Backend::reference);
  std::vector<double> o, lse;
  brute_force(P, o, lse);
  EXPECT_LT(rel_err(r.o.to_vector(), o), tol::kRefVsBruteForce);
  EXPECT_LT(rel_err(r.lse.to_vector(), lse), tol::kRefVsBruteForce);
  EXPECT_TRUE(r.guards_intact());
}

std::vector<Spec> brute_force_cases() {
  std::vector<Spec> c;
  for (BetaDist bd : {BetaDist::uniform, BetaDist::near0, BetaDist::near1, BetaDist::near2})
    c.push_back({.B = 2, .T = 9, .H = 1, .HQ = 1, .D = 4, .DV = 4, .beta = bd});
  c.push_back({.B = 1, .T = 1, .H = 1, .HQ = 1, .D = 8, .DV = 8});
  c.push_back({.B = 1, .T = 12, .H = 2, .HQ = 4, .D = 8, .DV = 5, .gate = true});
  c.push_back({.B = 1, .T = 10, .H = 2, .HQ = 2, .D = 6, .DV = 6, .seqlens = {1, 4, 5}, .permuted = true});
  return c;
}
INSTANTIATE_TEST_SUITE_P(Cases, RefVsBruteForce, ::testing::ValuesIn(brute_force_cases()),
                         [](const auto& info) { return info.param.name(); });

// loss = sum(dO * o) (+ sum(dlse * lse) with_lse); its gradient with respect to every input, by central
// differences.
void check_against_finite_differences(const Problem64& P, bool with_lse) {
  Case<double> r(P);
  r.forward(Backend::reference);
  if (with_lse)
    r.backward_with_lse(Backend::reference);
  else
    r.backward(Backend::reference);
  const std::vector<double> dO = r.dout.to_vector(), dL = r.dlse.to_vector();
  auto loss = [&](Problem64& Q) {
    Case<double> x(Q);
    x.forward(Backend::reference, false);
    const std::vector<double> o = x.o.to_vector(), lse = x.lse.to_vector();
    double acc = 0;
    for (size_t i = 0; i < o.size(); ++i) acc += o[i] * dO[i];
    if (with_lse)
      for (size_t i = 0; i < lse.size(); ++i) acc += lse[i] * dL[i];
    return acc;
  };
  struct Field {
    const char* name;
    std::vector<double> Problem64::*member;
    std::vector<double> analytic;
  };
  std::vector<Field> fields = {{"q", &Problem64::q, r.dq.to_vector()},
                               {"k", &Problem64::k, r.dk.to_vector()},
                               {"v", &Problem64::v, r.dv.to_vector()},
                               {"w", &Problem64::w, r.dw.to_vector()},
                               {"beta", &Problem64::beta, r.dbeta.to_vector()}};
  if (P.spec.gate) fields.push_back({"g", &Problem64::g, r.dg.to_vector()});
  const double h = tol::kFiniteDifferenceStep;
  for (Field& f : fields) {
    std::vector<double> numeric(f.analytic.size());
    Problem64 Q = P;
    for (size_t i = 0; i < numeric.size(); ++i) {
      const double x0 = (Q.*f.member)[i];
      (Q.*f.member)[i] = x0 + h;
      const double lp = loss(Q);
      (Q.*f.member)[i] = x0 - h;
      const double lm = loss(Q);
      (Q.*f.member)[i] = x0;
      numeric[i] = (lp - lm) / (2 * h);
    }
    EXPECT_LT(bound_ratio(f.analytic, numeric, tol::kFiniteDifference, tol::kFiniteDifferenceAbs), 1.0)
        << "gradient of " << f.name << (with_lse ? " (loss with lse)" : "") << ": relative error "
        << rel_err(f.analytic, numeric);
  }
}

class RefVsFiniteDifferences : public ::testing::TestWithParam<Spec> {};

TEST_P(RefVsFiniteDifferences, AllGradients) { check_against_finite_differences(Problem64(GetParam()), false); }
TEST_P(RefVsFiniteDifferences, AllGradientsOfALossWithLse) {
  check_against_finite_differences(Problem64(GetParam()), true);
}

std::vector<Spec> fd_cases() {
  std::vector<Spec> c;
  for (BetaDist bd : {BetaDist::uniform, BetaDist::near0, BetaDist::near1, BetaDist::near2})
    c.push_back({.B = 1, .T = 7, .H = 1, .HQ = 1, .D = 4, .DV = 4, .beta = bd, .seed = 3});
  c.push_back({.B = 2, .T = 6, .H = 1, .HQ = 2, .D = 3, .DV = 5, .gate = true, .seed = 4});
  c.push_back({.B = 1, .T = 8, .H = 2, .HQ = 4, .D = 4, .DV = 3, .gate = true, .seqlens = {1, 5, 2}, .seed = 5});
  c.push_back({.B = 1, .T = 1, .H = 1, .HQ = 1, .D = 3, .DV = 3, .gate = true, .seed = 6});
  return c;
}
INSTANTIATE_TEST_SUITE_P(Cases, RefVsFiniteDifferences, ::testing::ValuesIn(fd_cases()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace pathattn::test
