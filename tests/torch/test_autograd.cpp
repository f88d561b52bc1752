// The libtorch entry points: gradients of pathattn::path_attention against central finite differences in f64
// (torch C++ has no gradcheck), the key cache of path_attention_ex, and errors arriving as c10::Error that
// name the argument.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tolerances.h"
#include "torch/pathattn_torch.h"

namespace {

namespace tol = pathattn::test::tol;
using torch::Tensor;

struct Case {
  int64_t B, T, H, HQ, D, DV;
  bool gate;
  std::vector<int32_t> seqlens;  // non-empty: packed varlen batch (B == 1)
  std::string name;
};

// gtest names the parameter in test names; without this it prints the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Problem {
  Tensor q, k, v, w, beta, g, cu, probe, probe_lse;  // loss = sum(o * probe) [+ sum(lse * probe_lse)]
  std::optional<Tensor> gate() const { return g.defined() ? std::optional<Tensor>(g) : std::nullopt; }
  std::optional<Tensor> cu_seqlens() const { return cu.defined() ? std::optional<Tensor>(cu) : std::nullopt; }
  std::vector<Tensor*> inputs() {
    std::vector<Tensor*> r = {&q, &k, &v, &w, &beta};
    if (g.defined()) r.push_back(&g);
    return r;
  }
};

Problem make(const Case& c, uint64_t seed) {
  torch::manual_seed(seed);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  Problem p;
  p.q = torch::randn({c.B, c.T, c.HQ, c.D}, f64);
  p.k = torch::randn({c.B, c.T, c.H, c.D}, f64);
  p.v = torch::randn({c.B, c.T, c.H, c.DV}, f64);
  p.w = torch::randn({c.B, c.T, c.H, c.D}, f64);
  p.w = p.w / p.w.norm(2, -1, true);
  // beta away from the ends of [0, 2] and g away from 0 so that +-h steps stay valid inputs.
  p.beta = 0.2 + 1.6 * torch::rand({c.B, c.T, c.H}, f64);
  if (c.gate) p.g = -0.1 - torch::rand({c.B, c.T, c.HQ}, f64);
  if (!c.seqlens.empty()) {
    std::vector<int32_t> cu = {0};
    for (int32_t l : c.seqlens) cu.push_back(cu.back() + l);
    p.cu = torch::tensor(cu, torch::kInt32);
  }
  p.probe = torch::randn({c.B, c.T, c.HQ, c.DV}, f64);
  p.probe_lse = torch::randn({c.B, c.T, c.HQ}, f64);
  return p;
}

// The probed loss of the outputs: sum(o * probe), plus sum(lse * probe_lse) when with_lse.
Tensor probed(const pathattn::PathAttentionOutput& out, const Problem& p, bool with_lse) {
  Tensor l = (out.o * p.probe).sum();
  return with_lse ? l + (out.lse * p.probe_lse).sum() : l;
}

double loss(const Problem& p, bool with_lse) {
  torch::NoGradGuard no_grad;
  return probed(pathattn::path_attention_ex(p.q, p.k, p.v, p.w, p.beta, p.gate(), std::nullopt, p.cu_seqlens(), false),
                p, with_lse)
      .item<double>();
}

class Gradients : public ::testing::TestWithParam<Case> {};

void check_central_differences(const Case& c, bool with_lse) {
  Problem p = make(c, 7);
  std::vector<Tensor> analytic;
  {
    std::vector<Tensor> leaves;
    for (Tensor* t : p.inputs()) leaves.push_back(t->clone().requires_grad_(true));
    auto out = pathattn::path_attention_ex(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4],
                                           c.gate ? std::optional<Tensor>(leaves[5]) : std::nullopt, std::nullopt,
                                           p.cu_seqlens(), false);
    ASSERT_EQ(out.o.sizes(), torch::IntArrayRef({c.B, c.T, c.HQ, c.DV}));
    probed(out, p, with_lse).backward();
    for (Tensor& l : leaves) {
      ASSERT_TRUE(l.grad().defined());
      analytic.push_back(l.grad());
    }
  }
  const char* names[] = {"q", "k", "v", "w", "beta", "g"};
  const double h = tol::kFiniteDifferenceStep;
  std::vector<Tensor*> ins = p.inputs();
  for (size_t i = 0; i < ins.size(); ++i) {
    Tensor flat = ins[i]->view({-1});  // perturbs the problem's tensor in place
    Tensor numeric = torch::empty_like(flat);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double x = flat[e].item<double>();
      flat[e] = x + h;
      const double up = loss(p, with_lse);
      flat[e] = x - h;
      const double down = loss(p, with_lse);
      flat[e] = x;
      numeric[e] = (up - down) / (2 * h);
    }
    const double err = (analytic[i].reshape({-1}) - numeric).norm().item<double>();
    const double ref = numeric.norm().item<double>();
    EXPECT_LE(err, tol::kFiniteDifference * ref + tol::kFiniteDifferenceAbs)
        << c.name << (with_lse ? " (loss with lse)" : "") << ": d loss / d " << names[i]
        << " differs from central differences (|fd| = " << ref << ")";
  }
}

TEST_P(Gradients, MatchCentralDifferences) { check_central_differences(GetParam(), false); }
TEST_P(Gradients, MatchCentralDifferencesWithLseInTheLoss) { check_central_differences(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Shapes, Gradients,
                         ::testing::Values(Case{1, 6, 1, 1, 4, 4, false, {}, "plain"},
                                           Case{2, 5, 1, 2, 4, 3, true, {}, "gate_gqa_dv"},
                                           Case{1, 7, 2, 2, 3, 5, true, {3, 4}, "varlen_gate"},
                                           Case{1, 6, 1, 3, 2, 2, false, {1, 5}, "varlen_gqa"}),
                         [](const auto& info) { return info.param.name; });

// docs/spec.md §4: kcache row j is k_j carried to the end of its sequence, H_L .. H_{j+1} k_j; the last key is
// as given.
TEST(KeyCache, CarriesKeysToTheEnd) {
  Problem p = make(Case{1, 5, 2, 2, 4, 4, false, {}, "kcache"}, 3);
  auto out = pathattn::path_attention_ex(p.q, p.k, p.v, p.w, p.beta, std::nullopt, std::nullopt, std::nullopt, true);
  ASSERT_TRUE(out.kcache.defined());
  ASSERT_EQ(out.kcache.sizes(), p.k.sizes());
  Tensor expect = p.k.clone();  // [B, T, H, D]
  const int64_t T = p.k.size(1);
  for (int64_t j = 0; j < T; ++j)
    for (int64_t t = j + 1; t < T; ++t) {
      Tensor wt = p.w.select(1, t), kj = expect.select(1, j);  // [B, H, D]
      kj.sub_(p.beta.select(1, t).unsqueeze(-1) * (kj * wt).sum(-1, true) * wt);
    }
  EXPECT_LE((out.kcache - expect).abs().max().item<double>(), tol::kRefVsBruteForce);
  auto no_cache = pathattn::path_attention_ex(p.q, p.k, p.v, p.w, p.beta, std::nullopt, std::nullopt, std::nullopt, false);
  EXPECT_FALSE(no_cache.kcache.defined());
  EXPECT_TRUE(torch::equal(no_cache.o, out.o));
}

// Runs fn and expects a c10::Error whose message contains every fragment (the argument's name first).
template <typename Fn>
void expect_error(Fn fn, std::vector<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming " << fragments[0];
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

TEST(Errors, ArriveAsC10ErrorNamingTheArgument) {
  Problem p = make(Case{1, 4, 2, 4, 4, 4, false, {}, "err"}, 5);
  auto run = [&](const Tensor& q, const Tensor& k, const Tensor& beta, std::optional<Tensor> g = std::nullopt,
                 std::optional<Tensor> cu = std::nullopt) {
    return pathattn::path_attention(q, k, p.v, p.w, beta, g, std::nullopt, cu);
  };
  expect_error([&] { run(p.q.select(0, 0), p.k, p.beta); }, {"q", "4 dimensions"});
  expect_error([&] { run(p.q, p.k, p.beta.narrow(1, 0, 3)); }, {"beta", "[B, T, H]"});
  expect_error([&] { run(p.q.narrow(2, 0, 3), p.k, p.beta); }, {"HQ", "multiple"});
  expect_error([&] { run(p.q, p.k.to(torch::kFloat32), p.beta); }, {"k", "dtype"});
  expect_error([&] { run(p.q, p.k, p.beta * 1.5); }, {"beta", "[0, 2]"});
  expect_error([&] { run(p.q, p.k, p.beta, torch::zeros({1, 4, 3}, torch::kFloat64)); }, {"g", "[B, T, HQ]"});
  expect_error([&] { run(p.q, p.k, p.beta, std::nullopt, torch::tensor({0, 3, 2, 4}, torch::kInt32)); },
               {"cu_seqlens", "non-decreasing"});
  expect_error([&] { run(p.q, p.k, p.beta, std::nullopt, torch::tensor({0, 3}, torch::kInt32)); },
               {"cu_seqlens", "T = 4"});
  expect_error([&] { pathattn::path_attention(p.q, p.k, p.v, p.w, p.beta, std::nullopt, -1.0); }, {"scale"});
}

// A loss of lse alone: o's gradient is undefined (autograd passes none), lse's reaches the inputs.
TEST(LseGradient, LseAloneInTheLoss) {
  Problem p = make(Case{1, 4, 1, 1, 4, 4, false, {}, "lse"}, 9);
  Tensor q = p.q.clone().requires_grad_(true);
  auto out = pathattn::path_attention_ex(q, p.k, p.v, p.w, p.beta, std::nullopt, std::nullopt, std::nullopt, false);
  out.lse.sum().backward();
  ASSERT_TRUE(q.grad().defined());
  EXPECT_GT(q.grad().abs().max().item<double>(), 0.0);
}

}  // namespace
