// PaTH attention in the model: the plain-libtorch chunked fallback against the recurrence (f64), its key
// cache against decoding, and the torch op (when built) against the fallback.
#include <gtest/gtest.h>

#include <sstream>

#include "path_attention_torch.h"
#include "path_op.h"
#include "tolerances_model.h"

using namespace pathattn::model;

namespace {

struct Inputs {
  torch::Tensor q, k, v, w, beta, g;
};

Inputs random_inputs(int64_t B, int64_t T, int64_t HQ, int64_t H, int64_t D, int64_t DV, bool gate,
                     torch::Dtype dt, uint64_t seed) {
  torch::manual_seed(seed);
  auto o = torch::TensorOptions().dtype(dt);
  Inputs in;
  in.q = torch::randn({B, T, HQ, D}, o);
  in.k = torch::randn({B, T, H, D}, o);
  in.v = torch::randn({B, T, H, DV}, o);
  in.w = torch::nn::functional::normalize(torch::randn({B, T, H, D}, o),
                                          torch::nn::functional::NormalizeFuncOptions().dim(-1));
  in.beta = 2 * torch::rand({B, T, H}, o);
  if (gate) in.g = torch::log_sigmoid(torch::randn({B, T, HQ}, o) + 2);
  return in;
}

double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max() / b.to(torch::kDouble).abs().max().clamp_min(1e-30))
      .item<double>();
}

std::optional<torch::Tensor> opt(const torch::Tensor& t) { return t.defined() ? std::optional(t) : std::nullopt; }

}  // namespace

struct Case {
  int64_t B, T, HQ, H, D, DV, chunk;
  bool gate;
};
// Readable names for gtest (the default prints the struct's bytes, padding included).
void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_HQ" << c.HQ << "_H" << c.H << "_D" << c.D << "_DV" << c.DV << "_C" << c.chunk
      << (c.gate ? "_gate" : "");
}

class ChunkedVsRecurrence : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkedVsRecurrence, ForwardMatches) {
  const auto c = GetParam();
  auto in = random_inputs(c.B, c.T, c.HQ, c.H, c.D, c.DV, c.gate, torch::kDouble, 7);
  auto ref = path_attention_recurrent(in.q, in.k, in.v, in.w, in.beta, opt(in.g), std::nullopt);
  auto got = path_attention_chunked(in.q, in.k, in.v, in.w, in.beta, opt(in.g), std::nullopt, false, c.chunk).o;
  EXPECT_LT(rel_err(got, ref), test_tol::kF64Paths);
}

INSTANTIATE_TEST_SUITE_P(Cases, ChunkedVsRecurrence,
                         ::testing::Values(Case{2, 37, 2, 2, 8, 8, 8, false},   // T not a multiple of C
                                           Case{1, 64, 4, 2, 16, 12, 16, true},  // GQA, gate, DV != D
                                           Case{2, 5, 1, 1, 4, 4, 64, false},    // one short chunk
                                           Case{1, 50, 2, 1, 8, 8, 7, true}),  // MQA, odd chunk
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::ostringstream os;
                           PrintTo(info.param, &os);
                           return os.str();
                         });

// The key cache of a prefill of T tokens, extended by one recurrence step, reproduces the output at T + 1.
TEST(ModelAttention, KeyCacheContinuesTheRecurrence) {
  const int64_t T = 21;
  auto in = random_inputs(2, T + 1, 2, 2, 8, 8, false, torch::kDouble, 9);
  auto full = path_attention_recurrent(in.q, in.k, in.v, in.w, in.beta, std::nullopt, std::nullopt);
  auto pre = path_attention_chunked(in.q.narrow(1, 0, T), in.k.narrow(1, 0, T), in.v.narrow(1, 0, T),
                                    in.w.narrow(1, 0, T), in.beta.narrow(1, 0, T), std::nullopt, std::nullopt,
                                    true, 8);
  auto K = pre.kcache.transpose(1, 2);                           // [B, H, T, D]
  auto wt = in.w.narrow(1, T, 1).transpose(1, 2);                // [B, H, 1, D]
  auto bt = in.beta.narrow(1, T, 1).transpose(1, 2).unsqueeze(-1);  // [B, H, 1, 1]
  K = K - bt * (K * wt).sum(-1, true) * wt;
  K = torch::cat({K, in.k.narrow(1, T, 1).transpose(1, 2)}, 2);  // [B, H, T + 1, D]
  auto qt = in.q.narrow(1, T, 1).transpose(1, 2);                // [B, H, 1, D]
  auto p = torch::softmax(qt.matmul(K.transpose(-1, -2)) / std::sqrt(8.0), -1);
  auto o = p.matmul(in.v.transpose(1, 2)).transpose(1, 2);       // [B, 1, H, D]
  EXPECT_LT(rel_err(o, full.narrow(1, T, 1)), test_tol::kF64Paths);
}

TEST(ModelAttention, ChunkedGradientsMatchRecurrence) {
  auto in = random_inputs(1, 19, 2, 2, 8, 8, true, torch::kDouble, 13);
  std::vector<torch::Tensor> leaves{in.q, in.k, in.v, in.w, in.beta, in.g};
  auto grads = [&](bool chunked) {
    std::vector<torch::Tensor> xs;
    for (auto& t : leaves) xs.push_back(t.detach().clone().requires_grad_(true));
    auto o = chunked ? path_attention_chunked(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], std::nullopt, false, 4).o
                     : path_attention_recurrent(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], std::nullopt);
    (o * torch::cos(o)).sum().backward();
    std::vector<torch::Tensor> g;
    for (auto& x : xs) g.push_back(x.grad());
    return g;
  };
  auto a = grads(true), b = grads(false);
  const char* names[] = {"dq", "dk", "dv", "dw", "dbeta", "dg"};
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(rel_err(a[i], b[i]), test_tol::kF64Paths) << names[i];
}

TEST(ModelAttention, OpMatchesFallbackWhenBuilt) {
  if (!have_path_op()) GTEST_SKIP() << "this build has no pathattn_torch op";
  for (bool gate : {false, true}) {
    auto in = random_inputs(2, 150, 2, 2, 16, 16, gate, torch::kDouble, 17);
    auto ref = path_attention_chunked(in.q, in.k, in.v, in.w, in.beta, opt(in.g), std::nullopt, true);
    auto f = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; };
    auto got = path_attention_call(PathImpl::op, f(in.q), f(in.k), f(in.v), f(in.w), f(in.beta), opt(f(in.g)), true);
    EXPECT_LT(rel_err(got.o, ref.o), test_tol::kF32VsF64) << "gate " << gate;
    EXPECT_LT(rel_err(got.kcache, ref.kcache), test_tol::kF32VsF64) << "gate " << gate;
  }
}

TEST(ModelAttention, BadShapesNameTheArgument) {
  auto in = random_inputs(1, 8, 2, 2, 8, 8, false, torch::kFloat, 1);
  try {
    path_attention_chunked(in.q, in.k.narrow(3, 0, 4), in.v, in.w, in.beta, std::nullopt, std::nullopt, false);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("k must be"), std::string::npos) << e.what();
  }
  try {
    path_attention_chunked(in.q, in.k, in.v, in.w, in.beta.narrow(2, 0, 1), std::nullopt, std::nullopt, false);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("beta must be"), std::string::npos) << e.what();
  }
}
