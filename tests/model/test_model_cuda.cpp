// The model on CUDA (label gpu; run by tools/gpu_check.sh torch). Decoding: with a KV cache the layer and the model
// decode through the op's CUDA decode kernels (the cache on the device, no re-run of the sequence), and their outputs
// equal the full forward's by FlashAttention's rule against the same model in f64; greedy generation equals the argmax
// of repeated full forwards (ModelCudaDecode). Training: a step's gradients with PaTH's fast backward equal the
// deterministic one's to rounding, every parameter's gradient equals the same model's in f64 by FlashAttention's rule,
// and a run with torch's deterministic switch repeats bit for bit (ModelCudaTrain).
// The CUDA cases skip without a CUDA device. Each test also has CPU instances (f32 and bf16 autocast) with the same
// steps and checks, so that the test's logic runs on a machine without a GPU (./test_model_cuda there).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "precision.h"
#include "test_util.h"
#include "tolerances.h"
#include "tolerances_model.h"
#include "trainer.h"
#include "transformer.h"
#if __has_include("generate.h")
#include "generate.h"  // generate() moves there with the model's generation work; before, transformer.h declares it
#endif

using namespace pathattn::model;
namespace tol = pathattn::test::tol;

namespace {

// head_dim 64 (the CUDA kernels' D); GQA with 2 query heads per kv head.
ModelConfig config(Mechanism m) {
  ModelConfig c;
  c.vocab = 11;
  c.n_layer = 2;
  c.d_model = 256;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.mechanism = m;
  return c;
}

// The relative L2 error of a against the f64 result ref (the measure of tests/tolerances.h's low-precision rule).
double rel_err(const torch::Tensor& a, const torch::Tensor& ref) {
  auto r = ref.to(torch::kCPU, torch::kDouble);
  return (a.to(torch::kCPU, torch::kDouble) - r).norm().item<double>() / r.norm().item<double>();
}

// dst's parameters := src's (any devices and dtypes).
void copy_parameters(torch::nn::Module& dst, const torch::nn::Module& src) {
  torch::NoGradGuard ng;
  auto from = src.named_parameters();
  for (auto& p : dst.named_parameters()) p.value().copy_(from[p.key()]);
}

// q_proj and k_proj weights times 5 (std 0.1): at the N(0, 0.02) initialisation the logits are ~0.1, attention is
// nearly uniform and the keys (so the cache's carry) barely show in the output; at ~2.5 a wrong carry is O(1e-1).
void sharpen_attention(torch::nn::Module& m) {
  torch::NoGradGuard ng;
  for (auto& p : m.named_parameters()) {
    const std::string& name = p.key();
    auto ends_with = [&](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends_with("q_proj.weight") || ends_with("k_proj.weight")) p.value().mul_(5.0);
  }
}

using Case = std::tuple<std::string, Precision>;  // device, precision

class ModelCudaDecode : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (torch::Device(std::get<0>(GetParam())).is_cuda() && !torch::cuda::is_available())
      GTEST_SKIP() << "needs a CUDA device (this machine has none); runs on the H200 machine (tools/gpu_check.sh torch)";
  }
  // The parameter's device as tensors placed there report it: "cuda" resolves to the current one, "cuda:0".
  torch::Device device() const {
    return torch::empty({0}, torch::TensorOptions().device(torch::Device(std::get<0>(GetParam())))).device();
  }
  Precision precision() const { return std::get<1>(GetParam()); }
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) + "_" + precision_name(std::get<1>(info.param));
}

// The PaTH decode state of every layer: on the model's device, not the re-run's saved inputs.
void expect_op_decoding(const KVCache& cache, torch::Device dev, int64_t tokens, const std::string& what) {
  for (size_t l = 0; l < cache.size(); ++l) {
    const LayerCache& c = cache[l];
    EXPECT_FALSE(c.x.defined()) << what << ", layer " << l << ": decoding re-ran the sequence instead of the op's decode";
    ASSERT_TRUE(c.path.k.defined()) << what << ", layer " << l;
    EXPECT_EQ(c.path.k.device(), dev) << what << ", layer " << l;
    EXPECT_EQ(c.path.lengths.device(), dev) << what << ", layer " << l;
    EXPECT_EQ(c.path.lengths.min().item<int64_t>(), tokens) << what << ", layer " << l;
    EXPECT_EQ(c.path.lengths.max().item<int64_t>(), tokens) << what << ", layer " << l;
    EXPECT_EQ(c.pos, tokens) << what << ", layer " << l;
  }
}

// The layer (PaTH and PaTH-FoX, GQA): a prompt of 40 tokens, single tokens and a 5-token step up to 110 (past the
// state's first room of 40 + 64, so it grows once), against one forward over the 110 tokens. Rule (tests/tolerances.h,
// FlashAttention's): the cached run's error against the same layer in f64 is at most kLowPrecisionFactor times the
// full forward's own (bf16 enters both through the op's bf16 q, k, v and, under autocast, the projections) plus
// kLowPrecisionAbs.
TEST_P(ModelCudaDecode, LayerWithACacheEqualsItsFullForward) {
  const torch::Device dev = device();
  for (auto m : {Mechanism::path, Mechanism::path_fox}) {
    const std::string what = std::string(mechanism_name(m)) + " on " + dev.str() + ", " + precision_name(precision());
    torch::manual_seed(5);
    const ModelConfig cfg = config(m);
    Attention layer(cfg), ref(cfg);
    sharpen_attention(*layer);
    copy_parameters(*ref, *layer);
    layer->to(dev);
    ref->to(torch::kDouble);
    torch::NoGradGuard ng;
    auto x = torch::randn({2, 110, cfg.d_model});
    auto xd = x.to(dev);
    torch::Tensor full, cached;
    LayerCache cache;
    {
      AutocastGuard ac(dev, precision());
      full = layer->forward(xd);
      std::vector<torch::Tensor> parts{layer->forward(xd.narrow(1, 0, 40), &cache)};
      std::vector<int64_t> steps{1, 1, 5};
      steps.resize(steps.size() + 63, 1);
      int64_t t = 40;
      for (int64_t s : steps) {
        parts.push_back(layer->forward(xd.narrow(1, t, s), &cache));
        t += s;
      }
      ASSERT_EQ(t, 110);
      cached = torch::cat(parts, 1);
    }
    expect_op_decoding({cache}, dev, 110, what);
    EXPECT_EQ(cache.path.k.size(1), 2 * (40 + 64)) << what << ": the room grows once";
    EXPECT_EQ(cache.conv.device(), dev) << what;
    const auto y64 = ref->forward(x.to(torch::kDouble));
    const double err_full = rel_err(full, y64), err_cached = rel_err(cached, y64);
    EXPECT_LE(err_cached, tol::kLowPrecisionFactor * err_full + tol::kLowPrecisionAbs)
        << what << ": full forward's error " << err_full;
  }
}

// The model: a prompt of 20 tokens, then single tokens and a 5-token step, the logits against the full forward's by
// the same rule, with the same model in f64 as the reference.
TEST_P(ModelCudaDecode, KVCacheDecodingEqualsFullForward) {
  const torch::Device dev = device();
  for (auto m : {Mechanism::path, Mechanism::path_fox}) {
    const std::string what = std::string(mechanism_name(m)) + " on " + dev.str() + ", " + precision_name(precision());
    torch::manual_seed(6);
    const ModelConfig cfg = config(m);
    Transformer model(cfg), ref(cfg);
    sharpen_attention(*model);
    copy_parameters(*ref, *model);
    model->to(dev);
    ref->to(torch::kDouble);
    torch::NoGradGuard ng;
    auto tokens = torch::randint(0, cfg.vocab, {2, 100}, torch::kLong);
    auto td = tokens.to(dev);
    torch::Tensor full, cached;
    KVCache cache;
    {
      AutocastGuard ac(dev, precision());
      full = model->forward(td);
      std::vector<torch::Tensor> parts{model->forward(td.narrow(1, 0, 20), &cache)};
      for (int64_t t = 20; t < 95; ++t) parts.push_back(model->forward(td.narrow(1, t, 1), &cache));
      parts.push_back(model->forward(td.narrow(1, 95, 5), &cache));
      cached = torch::cat(parts, 1);
    }
    expect_op_decoding(cache, dev, 100, what);
    const auto logits64 = ref->forward(tokens);
    const double err_full = rel_err(full, logits64), err_cached = rel_err(cached, logits64);
    EXPECT_LE(err_cached, tol::kLowPrecisionFactor * err_full + tol::kLowPrecisionAbs)
        << what << ": full forward's error " << err_full;
  }
}

// generate() (prefill, then one token per call through the cache) against the argmax of a full forward over each
// generated prefix. The two differ by low-precision rounding, so a token may differ only where the full forward's
// best and the generated token's logits are within twice test_tol::kBf16VsF32 of the logits' largest magnitude (each
// side within it of the exact result: it bounds a bf16 autocast forward, of which these runs are at most one); most
// positions must be decided (gap beyond that), so the check is not vacuous.
TEST_P(ModelCudaDecode, GreedyGenerationMatchesRepeatedFullForward) {
  const torch::Device dev = device();
  for (auto m : {Mechanism::path, Mechanism::path_fox}) {
    const std::string what = std::string(mechanism_name(m)) + " on " + dev.str() + ", " + precision_name(precision());
    torch::manual_seed(7);
    Transformer model(config(m));
    sharpen_attention(*model);
    model->to(dev);
    auto prompt = torch::randint(0, model->config().vocab, {2, 12}, torch::kLong).to(dev);
    AutocastGuard ac(dev, precision());
    const int64_t n = 16;
    auto gen = generate(model, prompt, n);
    ASSERT_EQ(gen.sizes(), (std::vector<int64_t>{2, 12 + n})) << what;
    torch::NoGradGuard ng;
    int decided = 0, positions = 0;
    for (int64_t i = 0; i < n; ++i) {
      auto logits = model->forward(gen.narrow(1, 0, 12 + i)).select(1, -1).to(torch::kCPU, torch::kDouble);  // [B, V]
      const double window = 2 * test_tol::kBf16VsF32 * logits.abs().max().item<double>();
      auto top2 = std::get<0>(logits.topk(2, -1));
      for (int64_t b = 0; b < gen.size(0); ++b) {
        const int64_t token = gen[b][12 + i].item<int64_t>();
        const double best = top2[b][0].item<double>(), gap = best - logits[b][token].item<double>();
        ++positions;
        if (top2[b][0].item<double>() - top2[b][1].item<double>() > window) {
          ++decided;
          EXPECT_EQ(gap, 0.0) << what << ": sequence " << b << ", token " << 12 + i << " is not the full forward's argmax";
        } else {
          EXPECT_LE(gap, window) << what << ": sequence " << b << ", token " << 12 + i;
        }
      }
    }
    EXPECT_GE(2 * decided, positions) << what << ": too few positions with a clear argmax to check";
  }
}

// The model's training step with PaTH's fast CUDA backward (PathRunOptions::deterministic_backward = false, the
// trainer's --deterministic false): every parameter's gradient equals the deterministic one's to the summation-order
// rule (tests/tolerances.h kSummationOrderBf16, relative L2 over all parameters together); on the CPU, where the flag
// changes nothing, the same bits. T = 200: four chunks, the last one partial.
class ModelCudaTrain : public ModelCudaDecode {};

TEST_P(ModelCudaTrain, FastBackwardEqualsTheDeterministicOneToRounding) {
  const torch::Device dev = device();
  for (auto m : {Mechanism::path, Mechanism::path_fox}) {
    const std::string what = std::string(mechanism_name(m)) + " on " + dev.str() + ", " + precision_name(precision());
    torch::manual_seed(11);
    Transformer model(config(m));
    sharpen_attention(*model);
    model->to(dev);
    auto tokens = torch::randint(0, model->config().vocab, {2, 201}, torch::kLong).to(dev);
    auto input = tokens.narrow(1, 0, 200), target = tokens.narrow(1, 1, 200);
    auto grads = [&](bool det) {
      PathRunOptions run;
      run.deterministic_backward = det;
      model->set_path_run_options(run);
      model->zero_grad();
      torch::Tensor loss;
      {
        AutocastGuard ac(dev, precision());
        auto logits = model->forward(input);
        loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
      }
      loss.backward();
      std::vector<torch::Tensor> g;
      for (const auto& p : model->parameters()) g.push_back(p.grad().detach().to(torch::kCPU, torch::kDouble).flatten());
      return torch::cat(g);
    };
    // On the CPU the flag changes nothing, but the op's CPU backward is bitwise reproducible only at a fixed split
    // of its work (test_model.cpp CheckpointResumeIsExact measured ~1e-8 relative run to run with several threads):
    // one thread there, so that equal bits are what to expect.
    const int threads = at::get_num_threads();
    if (dev.is_cpu()) at::set_num_threads(1);
    const auto det = grads(true), fast = grads(false);
    at::set_num_threads(threads);
    ASSERT_GT(det.norm().item<double>(), 0.0) << what;
    if (dev.is_cpu()) {
      EXPECT_TRUE(torch::equal(fast, det)) << what << ": the CPU backward has one summation order";
    } else {
      EXPECT_LE(rel_err(fast, det), tol::kSummationOrderBf16) << what;
    }
  }
}

// The model's gradients on the device against the same model in f64 on the CPU, parameter by parameter, by
// FlashAttention's rule: the device's relative error at most kLowPrecisionFactor times that of the same model run on
// the CPU under bf16 autocast, plus kLowPrecisionAbs. The baseline is bf16 in every case because the CUDA op takes
// q, k, v in bf16 even in an f32 run (model/path_op.cpp), which the CPU's f32 run does not round; under bf16
// autocast both round the projections and the op's inputs alike. At T = 200 (four chunks, the last one partial) and
// T = 10 (one partial chunk: the A5 cells' lengths, where a three-layer PaTH trained far slower than RoPE on the
// GPU, docs/results/synthetic/README.md). A parameter whose gradient is lost or misrouted on the device fails by
// O(1) whatever the norms of the others; on the CPU the check runs its logic (bf16: the same run twice). A bias per
// head (fewer than kFewSummedElements elements, each a sum over every token) is checked for routing only: its error is
// one draw of a cancelling sum, which the ratio rule cannot judge alone (tolerances_model.h; the first GPU run had
// block1.attn.bt_proj.bias at T 10 at 2.1x the CPU's error, every other parameter within 2x); the op's dbeta and dg
// keep the rule per element in test_cuda_backward, at this attention's shape too.
TEST_P(ModelCudaTrain, GradientsEqualTheF64Model) {
  const torch::Device dev = device();
  for (auto m : {Mechanism::path, Mechanism::path_fox}) {
    for (int64_t T : {200, 10}) {
      const std::string what = std::string(mechanism_name(m)) + " on " + dev.str() + ", " +
                               precision_name(precision()) + ", T " + std::to_string(T);
      torch::manual_seed(12);
      const ModelConfig cfg = config(m);
      Transformer model(cfg), on_cpu(cfg), ref(cfg);
      sharpen_attention(*model);
      copy_parameters(*on_cpu, *model);
      copy_parameters(*ref, *model);
      model->to(dev);
      ref->to(torch::kDouble);
      const auto tokens = torch::randint(0, cfg.vocab, {4, T + 1}, torch::kLong);
      // Every parameter's gradient by name, in f64 on the CPU, the forward under autocast to `p`.
      auto grads = [&](Transformer& net, torch::Device d, Precision p) {
        net->zero_grad();
        const auto td = tokens.to(d);
        torch::Tensor loss;
        {
          AutocastGuard ac(d, p);
          auto logits = net->forward(td.narrow(1, 0, T));
          loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                      td.narrow(1, 1, T).reshape({-1}));
        }
        loss.backward();
        std::vector<std::pair<std::string, torch::Tensor>> g;
        for (const auto& p : net->named_parameters())
          g.emplace_back(p.key(), p.value().grad().detach().to(torch::kCPU, torch::kDouble));
        return g;
      };
      const auto g_dev = grads(model, dev, precision()), g_cpu = grads(on_cpu, torch::kCPU, Precision::bf16);
      const auto g64 = grads(ref, torch::kCPU, Precision::f32);  // f32: no autocast, the f64 model stays f64
      ASSERT_EQ(g_dev.size(), g64.size()) << what;
      ASSERT_EQ(g_cpu.size(), g64.size()) << what;
      int checked = 0;
      double worst = 0;  // the largest error / bound over the parameters under the rule, for the record
      for (size_t i = 0; i < g64.size(); ++i) {
        const auto& [name, exact] = g64[i];
        ASSERT_EQ(g_dev[i].first, name) << what;
        if (exact.norm().item<double>() == 0.0) continue;  // e.g. the embedding rows of tokens not drawn
        const double err_dev = rel_err(g_dev[i].second, exact), err_cpu = rel_err(g_cpu[i].second, exact);
        if (exact.numel() < test_tol::kFewSummedElements) {  // a bias per head: routing only (tests/tolerances.h)
          EXPECT_LE(err_dev, test_tol::kGradientRouting)
              << what << ", " << name << ": lost or misrouted? (the CPU's error under bf16 autocast " << err_cpu << ")";
          std::printf("%s, %s (%ld elements, routing bound): error %.3g, the CPU's under bf16 autocast %.3g\n",
                      what.c_str(), name.c_str(), static_cast<long>(exact.numel()), err_dev, err_cpu);
        } else {
          EXPECT_LE(err_dev, tol::kLowPrecisionFactor * err_cpu + tol::kLowPrecisionAbs)
              << what << ", " << name << ": the CPU's error under bf16 autocast " << err_cpu;
          worst = std::max(worst, err_dev / (tol::kLowPrecisionFactor * err_cpu + tol::kLowPrecisionAbs));
        }
        ++checked;
      }
      EXPECT_GT(checked, 10) << what;
      std::printf("%s: %d parameters, the largest error / bound under the rule %.2f\n", what.c_str(), checked, worst);
    }
  }
}

// TrainConfig::torch_deterministic with the op's deterministic backward: two training runs from one seed end with
// the same weights, bit for bit (4 steps of a flip-flop model, PaTH and PaTH-FoX, GQA). Without the switch a CUDA run
// does not repeat (torch's boolean-mask loss and embedding backward add with atomics; docs/results/synthetic).
TEST_P(ModelCudaTrain, TorchDeterministicRunRepeatsBitForBit) {
  const torch::Device dev = device();
  FlipFlopConfig fc;
  fc.pairs = 100;  // 199 tokens: four chunks, the last one partial
  auto task = make_flipflop(fc);
  for (auto m : {Mechanism::path, Mechanism::path_fox}) {
    const std::string what = std::string(mechanism_name(m)) + " on " + dev.str() + ", " + precision_name(precision());
    auto run = [&] {
      torch::manual_seed(9);
      ModelConfig cfg = config(m);
      cfg.vocab = task->vocab();
      Transformer model(cfg);
      TrainConfig tc = test_util::short_train(4, 4, 8);
      tc.device = dev;
      tc.precision = precision();
      tc.torch_deterministic = true;
      train(model, *task, tc, "repeat");
      std::vector<torch::Tensor> p;
      for (const auto& t : model->parameters()) p.push_back(t.detach().to(torch::kCPU).flatten());
      return torch::cat(p);
    };
    const int threads = at::get_num_threads();
    if (dev.is_cpu()) at::set_num_threads(1);  // the CPU backward's bits depend on how its work is split
    const auto a = run(), b = run();
    at::set_num_threads(threads);
    EXPECT_TRUE(torch::equal(a, b)) << what << ": max difference " << (a - b).abs().max().item<double>();
  }
}

// RoPE's fused rotation on CUDA (pathattn::rope_rotate, PathRunOptions::fused_rope) against the composed form the
// recorded RoPE runs used: the same outputs and gradients bit for bit in f32, bf16 and f16, x contiguous and strided;
// then a RoPE model with and without it under bf16 autocast: the same loss and the same gradient of every parameter.
TEST(RopeRotateCuda, FusedEqualsTheComposedFormBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device; runs on the GPU machine (tools/gpu_check.sh torch)";
  torch::manual_seed(4);
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto x = torch::randn({2, 300, 4, 64}, torch::TensorOptions().device(torch::kCUDA)).to(dt);
    EXPECT_EQ(test_util::rope_fused_vs_composed(x), "") << dt;
    const auto wide = torch::randn({1, 77, 8, 128}, torch::TensorOptions().device(torch::kCUDA)).to(dt);
    EXPECT_EQ(test_util::rope_fused_vs_composed(wide.slice(2, 1, 8, 2)), "") << dt << ", strided";
  }
  const torch::Device dev(torch::kCUDA);
  ModelConfig cfg = test_util::tiny(Mechanism::rope, 50);
  cfg.d_model = 128, cfg.n_head = 2, cfg.n_layer = 2;  // D = 64
  torch::manual_seed(5);
  Transformer a(cfg), b(cfg);
  copy_parameters(*b, *a);
  a->to(dev), b->to(dev);
  PathRunOptions composed, fused;  // explicit both ways: the model's default is the fused rotation
  composed.fused_rope = false;
  fused.fused_rope = true;
  a->set_path_run_options(composed);
  b->set_path_run_options(fused);
  const auto tokens = torch::randint(0, cfg.vocab, {3, 41}, torch::kLong).to(dev);
  auto run = [&](Transformer& m) {
    m->zero_grad();
    AutocastGuard ac(dev, Precision::bf16);
    auto logits = m->forward(tokens.narrow(1, 0, 40));
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, cfg.vocab}).to(torch::kFloat),
                                                     tokens.narrow(1, 1, 40).reshape({-1}));
    loss.backward();
    return loss.detach();
  };
  EXPECT_TRUE(torch::equal(run(a), run(b))) << "loss";
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    const auto& ga = item.value().grad();
    const auto& gb = pb[item.key()].grad();
    ASSERT_TRUE(ga.defined() && gb.defined()) << item.key();
    EXPECT_TRUE(torch::equal(ga, gb)) << item.key() << ": max difference " << (ga - gb).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ModelCudaTrain,
                         ::testing::Values(Case{"cpu", Precision::f32}, Case{"cpu", Precision::bf16},
                                           Case{"cuda", Precision::f32}, Case{"cuda", Precision::bf16}),
                         case_name);

INSTANTIATE_TEST_SUITE_P(Devices, ModelCudaDecode,
                         ::testing::Values(Case{"cpu", Precision::f32}, Case{"cpu", Precision::bf16},
                                           Case{"cuda", Precision::f32}, Case{"cuda", Precision::bf16}),
                         case_name);

}  // namespace
