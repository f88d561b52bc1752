// The model's attention layer: fla's parameter names and shapes (the state_dict keys Python's PaTHAttention and
// fla's have), fla's initialisation, the gate_scale option, GQA, and decoding several tokens per call equal to the
// full forward (through the op's decode in f32, through the interim re-run in f64). The same outputs as the Python
// layer on the same weights: tests/python/test_cross_language.py (ctest ModelLayer.SameOutputsAsPython).
#include <gtest/gtest.h>

#include <map>

#include "attention.h"
#include "test_util.h"
#include "tolerances_model.h"

using namespace pathattn::model;

namespace {

ModelConfig layer_config(Mechanism m, int64_t kv_heads = 0) {
  ModelConfig c;
  c.vocab = 1;
  c.d_model = 64;
  c.n_head = 4;
  c.n_kv_head = kv_heads;
  c.mechanism = m;
  return c;
}

std::map<std::string, std::vector<int64_t>> shapes(Attention& a) {
  std::map<std::string, std::vector<int64_t>> r;
  for (const auto& p : a->named_parameters()) r[p.key()] = p.value().sizes().vec();
  return r;
}

void copy_parameters(Attention& to, Attention& from) {
  torch::NoGradGuard ng;
  auto src = from->named_parameters();
  for (auto& p : to->named_parameters()) p.value().copy_(src[p.key()]);
}

double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

}  // namespace

TEST(ModelAttention, ParameterNamesAndShapesAreFlas) {
  auto c = layer_config(Mechanism::path_fox, 2);  // E 64, HQ 4, H 2, D 16
  c.qk_norm = true;
  Attention a(c);
  const std::map<std::string, std::vector<int64_t>> want{
      {"q_proj.weight", {64, 64}},   {"k_proj.weight", {32, 64}},     {"v_proj.weight", {32, 64}},
      {"w_proj.0.weight", {32, 64}}, {"w_proj.1.weight", {32, 32}},   {"maybe_q_norm.weight", {16}},
      {"maybe_k_norm.weight", {16}}, {"w_conv1d.weight", {32, 1, 3}}, {"bt_proj.weight", {2, 64}},
      {"bt_proj.bias", {2}},         {"g_proj.weight", {4, 64}},      {"g_proj.bias", {4}},
      {"o_proj.weight", {64, 64}}};
  EXPECT_EQ(shapes(a), want);

  auto full = layer_config(Mechanism::path);
  full.low_rank_w = false;
  full.w_shortconv = false;
  Attention b(full);
  auto s = shapes(b);
  EXPECT_EQ(s.count("w_proj.weight"), 1u);
  EXPECT_EQ(s.count("w_conv1d.weight"), 0u);
  EXPECT_EQ(s.count("g_proj.weight"), 0u);
  EXPECT_EQ(s.count("maybe_q_norm.weight"), 0u);
}

TEST(ModelAttention, InitialisationIsFlas) {
  torch::manual_seed(3);
  auto c = layer_config(Mechanism::path_fox);
  c.d_model = 256;
  Attention a(c);
  for (const auto& p : a->named_parameters()) {
    const auto& t = p.value();
    if (p.key().find("bias") != std::string::npos) {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0) << p.key();
    } else if (t.numel() >= 3000) {  // N(0, 0.02), the conv too (fla's _init_weights covers nn.Conv1d)
      EXPECT_NEAR(t.std().item<double>(), 0.02, 0.002) << p.key();
    }
  }
}

TEST(ModelAttention, FlaGateScaleScalesTheGate) {
  auto c = layer_config(Mechanism::path_fox);
  torch::manual_seed(5);
  Attention ours(c);
  c.gate_scale = GateScale::fla;
  Attention fla(c);
  copy_parameters(fla, ours);
  auto x = torch::randn({2, 7, 64});
  torch::NoGradGuard ng;
  EXPECT_TRUE(torch::allclose(fla->g_of(x), ours->g_of(x) / 4.0, 0, 1e-7));  // D = 16: scale 1/4
  EXPECT_GT((fla->forward(x) - ours->forward(x)).abs().max().item<double>(), 1e-4);
  EXPECT_THROW(parse_gate_scale("sqrt"), std::invalid_argument);
}

// Prefill, then steps of 1 and of several tokens: the same outputs as one forward, for PaTH, PaTH-FoX with GQA, and
// the softmax mechanisms with GQA. f32 goes through the op's decode (PaTH); f64 re-runs the op's forward (PaTH).
TEST(ModelAttention, DecodingEqualsTheFullForward) {
  for (auto dt : {torch::kFloat, torch::kDouble}) {
    for (auto m : {Mechanism::path, Mechanism::path_fox, Mechanism::rope, Mechanism::fox}) {
      for (int64_t kv : {0, 2, 1}) {
        torch::manual_seed(9);
        auto c = layer_config(m, kv);
        c.qk_norm = kv == 2;
        Attention a(c);
        a->to(dt);
        torch::NoGradGuard ng;
        auto x = torch::randn({2, 90, 64}, dt);
        auto full = a->forward(x);
        LayerCache cache;
        std::vector<torch::Tensor> parts{a->forward(x.narrow(1, 0, 13), &cache)};
        int64_t t = 13;
        for (int64_t s : {1, 5, 1, 70}) {  // past the op cache's first growth (prefill + 64)
          parts.push_back(a->forward(x.narrow(1, t, s), &cache));
          t += s;
        }
        EXPECT_EQ(cache.pos, 90);
        const double err = rel_err(torch::cat(parts, 1), full);
        EXPECT_LT(err, dt == torch::kFloat ? test_tol::kF32VsF64 : test_tol::kF64Paths)
            << mechanism_name(m) << " kv " << kv << (dt == torch::kFloat ? " f32" : " f64");
      }
    }
  }
}

TEST(ModelAttention, BadHeadCountsAreRejected) {
  auto c = layer_config(Mechanism::path, 3);  // 4 query heads, 3 kv heads
  EXPECT_THROW(c.validate(), std::invalid_argument);
}

// PaTH on cuda: head dimensions 64 and 128 only (the CUDA kernels'), named by the model's sizes; the other
// mechanisms (SDPA, FoX's attention in torch) and the CPU take any.
TEST(ModelAttention, CudaHeadDimensionsAreCheckedByName) {
  ModelConfig c;
  c.vocab = 5;
  c.n_head = 2;
  for (Mechanism m : {Mechanism::path, Mechanism::path_fox}) {
    c.mechanism = m;
    c.d_model = 64;  // D = 32: the demo's CPU model
    try {
      c.validate_on_cuda();
      ADD_FAILURE() << mechanism_name(m) << " with D = 32 passed";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("width 64 / 2 heads = 32"), std::string::npos) << e.what();
    }
    for (int64_t width : {128, 256}) {  // D = 64, 128
      c.d_model = width;
      EXPECT_NO_THROW(c.validate_on_cuda()) << mechanism_name(m) << " width " << width;
    }
  }
  c.d_model = 64;
  for (Mechanism m : {Mechanism::rope, Mechanism::fox, Mechanism::nope}) {
    c.mechanism = m;
    EXPECT_NO_THROW(c.validate_on_cuda()) << mechanism_name(m);
  }
}

// The layer's w path runs through the fused op (ShortConvolution::directions, pathattn::short_conv_w): the same
// directions and gradients as the composition it replaced (forward(), then F.normalize's rule), from a sequence
// start and continuing after a state, in f64 (to rounding) and f32.
TEST(ModelAttention, FusedDirectionsEqualTheComposition) {
  for (auto dtype : {torch::kDouble, torch::kFloat}) {
    torch::manual_seed(4);
    ShortConvolution conv(12, 4);
    conv->to(dtype);
    {
      torch::NoGradGuard ng;
      conv->weight.normal_(0.0, 0.5);
    }
    const auto opts = torch::TensorOptions().dtype(dtype);
    auto u = torch::randn({2, 9, 12}, opts).requires_grad_(true);
    for (bool with_state : {false, true}) {
      auto state = with_state ? torch::randn({2, 3, 12}, opts) : torch::Tensor();
      torch::Tensor out_fused, out_comp;
      auto fused = conv->directions(u, 4, state, &out_fused);
      auto y = conv->forward(u, state, &out_comp).view({2, 9, 3, 4});
      auto comp = torch::nn::functional::normalize(y, torch::nn::functional::NormalizeFuncOptions().p(2).dim(-1).eps(1e-12));
      const double tol = dtype == torch::kDouble ? 1e-13 : 2e-6;
      EXPECT_LT(rel_err(fused, comp), tol) << "with_state " << with_state;
      EXPECT_TRUE(torch::equal(out_fused, out_comp));  // the next call's state
      auto r = torch::randn_like(comp);
      auto g_fused = torch::autograd::grad({(fused * r).sum()}, {u, conv->weight});
      auto g_comp = torch::autograd::grad({(comp * r).sum()}, {u, conv->weight});
      EXPECT_LT(rel_err(g_fused[0], g_comp[0]), dtype == torch::kDouble ? 1e-12 : 1e-5) << "du";
      EXPECT_LT(rel_err(g_fused[1], g_comp[1]), dtype == torch::kDouble ? 1e-12 : 1e-5) << "dweight";
    }
  }
}

// RoPE's fused rotation (pathattn::rope_rotate) equals the composed form bit for bit, forward and backward, on the
// CPU in f32 and f64 (the CUDA dtypes: test_model_cuda.cpp); a strided x (a view of every other head) too.
TEST(RopeRotate, FusedEqualsTheComposedFormBitForBitOnTheCpu) {
  torch::manual_seed(3);
  for (auto dt : {torch::kFloat, torch::kDouble}) {
    const auto x = torch::randn({2, 37, 3, 64}, torch::TensorOptions().dtype(dt));
    EXPECT_EQ(pathattn::model::test_util::rope_fused_vs_composed(x), "") << dt;
    const auto wide = torch::randn({2, 37, 6, 16}, torch::TensorOptions().dtype(dt));
    EXPECT_EQ(pathattn::model::test_util::rope_fused_vs_composed(wide.slice(2, 0, 6, 2)), "") << dt << ", strided";
  }
}
