// The layer and the model: gradients reach every parameter, KV-cache decoding equals the full forward,
// save/load keeps the logits, one batch is overfitted, a tiny training run beats chance, resume is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "checkpoint.h"
#include "dir_ops.h"
#include "test_util.h"
#include "tolerances_model.h"
#include "trainer.h"

using namespace pathattn::model;
using namespace pathattn::model::test_util;

namespace {

const Mechanism kAll[] = {Mechanism::path, Mechanism::path_fox, Mechanism::rope, Mechanism::fox, Mechanism::nope};

std::string label(Mechanism m, bool qk = false) { return std::string(mechanism_name(m)) + (qk ? "+qknorm" : ""); }

}  // namespace

TEST(Model, GradientsReachEveryParameter) {
  for (auto m : kAll) {
    for (bool qk : {false, true}) {
      torch::manual_seed(1);
      auto cfg = tiny(m);
      cfg.qk_norm = qk;
      Transformer model(cfg);
      auto tokens = torch::randint(0, cfg.vocab, {2, 40}, torch::kLong);
      model->forward(tokens).pow(2).mean().backward();
      for (const auto& p : model->named_parameters()) {
        ASSERT_TRUE(p.value().grad().defined()) << label(m, qk) << ": no gradient for " << p.key();
        EXPECT_GT(p.value().grad().abs().max().item<double>(), 0.0) << label(m, qk) << ": zero gradient for " << p.key();
      }
    }
  }
}

// bf16 autocast (precision.h) on the CPU, where it can be checked here: matmuls run in bf16 inside the guard and in
// f32 after it, the logits stay f32 and near the f32 model's, the parameters and their gradients stay f32 (AdamW's
// master copy), every parameter gets a gradient. PaTH goes through path_op's casts (the op in f32 on the CPU).
TEST(Model, Bf16AutocastKeepsF32ParametersAndGradients) {
  const auto x = torch::randn({3, 8}), wt = torch::randn({5, 8});
  {
    AutocastGuard guard(torch::kCPU, Precision::bf16);
    EXPECT_EQ(torch::nn::functional::linear(x, wt).scalar_type(), torch::kBFloat16);
    AutocastGuard nested(torch::kCPU, Precision::f32);  // f32: no change
    EXPECT_EQ(torch::nn::functional::linear(x, wt).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::nn::functional::linear(x, wt).scalar_type(), torch::kFloat);
  for (auto m : kAll) {
    torch::manual_seed(4);
    auto cfg = tiny(m);
    Transformer model(cfg);
    auto tokens = torch::randint(0, cfg.vocab, {2, 40}, torch::kLong);
    torch::Tensor ref;
    {
      torch::NoGradGuard ng;
      ref = model->forward(tokens);  // [B, T, V] f32
    }
    torch::Tensor logits;
    {
      AutocastGuard guard(torch::kCPU, Precision::bf16);
      logits = model->forward(tokens);
    }
    ASSERT_EQ(logits.scalar_type(), torch::kFloat) << label(m);
    const double err = (logits - ref).abs().max().item<double>() / ref.abs().max().item<double>();
    EXPECT_GT(err, 0.0) << label(m) << ": identical to f32, so bf16 did not run";
    EXPECT_LT(err, test_tol::kBf16VsF32) << label(m);
    logits.pow(2).mean().backward();
    for (const auto& p : model->named_parameters()) {
      EXPECT_EQ(p.value().scalar_type(), torch::kFloat) << label(m) << ": " << p.key();
      ASSERT_TRUE(p.value().grad().defined()) << label(m) << ": no gradient for " << p.key();
      EXPECT_EQ(p.value().grad().scalar_type(), torch::kFloat) << label(m) << ": " << p.key();
      EXPECT_GT(p.value().grad().abs().max().item<double>(), 0.0) << label(m) << ": zero gradient for " << p.key();
    }
  }
}

// Prefill of a prompt, then one token at a time through the KV cache: the logits equal the full forward's
// (f64 so that the comparison is tight; PaTH in f64 takes the interim re-run through the op's forward, the path
// CUDA takes until its decode kernel exists).
TEST(Model, KVCacheDecodingEqualsFullForward) {
  for (auto m : kAll) {
    torch::manual_seed(2);
    auto cfg = tiny(m);
    Transformer model(cfg);
    model->to(torch::kDouble);
    torch::NoGradGuard ng;
    auto tokens = torch::randint(0, cfg.vocab, {2, 45}, torch::kLong);
    auto full = model->forward(tokens);  // [B, T, V]
    KVCache cache;
    auto pre = model->forward(tokens.narrow(1, 0, 30), &cache);
    std::vector<torch::Tensor> parts{pre};
    for (int64_t t = 30; t < 40; ++t) parts.push_back(model->forward(tokens.narrow(1, t, 1), &cache));
    parts.push_back(model->forward(tokens.narrow(1, 40, 5), &cache));  // several tokens in one call
    auto got = torch::cat(parts, 1);
    const double err = (got - full).abs().max().item<double>() / full.abs().max().item<double>();
    EXPECT_LT(err, test_tol::kF64Paths) << label(m);
  }
}

// The same in f32 through the op's fused decode step (pathattn::decode, CPU f32), past the first growth of its
// cache's room (prefill + 64 tokens): f32 rounding only, both for PaTH and PaTH-FoX.
TEST(Model, KVCacheDecodingThroughTheOpInF32) {
  for (auto m : {Mechanism::path, Mechanism::path_fox}) {
    torch::manual_seed(4);
    auto cfg = tiny(m);
    Transformer model(cfg);
    torch::NoGradGuard ng;
    auto tokens = torch::randint(0, cfg.vocab, {2, 100}, torch::kLong);
    auto full = model->forward(tokens);  // [B, T, V]
    KVCache cache;
    std::vector<torch::Tensor> parts{model->forward(tokens.narrow(1, 0, 20), &cache)};
    for (int64_t t = 20; t < 100; ++t) parts.push_back(model->forward(tokens.narrow(1, t, 1), &cache));
    auto got = torch::cat(parts, 1);
    const double err = (got - full).abs().max().item<double>() / full.abs().max().item<double>();
    EXPECT_LT(err, test_tol::kF32VsF64) << label(m);
  }
}

// Speculative decoding: draft tokens scored without commit give the logits the committing call gives and leave
// every layer's cache as it was; feeding the accepted tokens then continues as the full forward. Every mechanism
// in f32 (PaTH through the op's decode without commit) and in f64 (PaTH re-running the sequence). A call without
// commit on an empty cache is an error.
TEST(Model, ForwardWithoutCommitLeavesTheCache) {
  for (auto dtype : {torch::kFloat, torch::kDouble})
    for (auto m : kAll) {
      SCOPED_TRACE(std::string(label(m)) + (dtype == torch::kDouble ? " f64" : " f32"));
      torch::manual_seed(6);
      auto cfg = tiny(m);
      Transformer model(cfg);
      model->to(dtype);
      torch::NoGradGuard ng;
      auto tokens = torch::randint(0, cfg.vocab, {2, 40}, torch::kLong);
      auto full = model->forward(tokens);
      KVCache tried, plain;
      model->forward(tokens.narrow(1, 0, 30), &tried);
      model->forward(tokens.narrow(1, 0, 30), &plain);
      auto snapshot = [](const KVCache& c) {  // every tensor of every layer's cache, cloned, and the positions
        std::vector<torch::Tensor> ts;
        for (const auto& l : c) {
          for (const auto& t : {l.path.k, l.path.v, l.path.gcum, l.path.lengths, l.conv, l.x, l.k, l.v, l.G})
            ts.push_back(t.defined() ? t.clone() : t);
          ts.push_back(torch::tensor(l.pos));
        }
        return ts;
      };
      auto same = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
        if (a.size() != b.size()) return false;
        for (size_t i = 0; i < a.size(); ++i)
          if (a[i].defined() != b[i].defined() || (a[i].defined() && !torch::equal(a[i], b[i]))) return false;
        return true;
      };
      const auto before = snapshot(tried);
      auto draft = tokens.narrow(1, 30, 6);
      auto scored = model->forward(draft, &tried, /*commit=*/false);
      EXPECT_TRUE(same(snapshot(tried), before)) << "a call without commit changed the cache";
      auto committed = model->forward(draft, &plain);
      EXPECT_TRUE(torch::equal(scored, committed)) << "the CPU computes the same either way";
      model->forward(tokens.narrow(1, 30, 4), &tried);  // accept 4 of the 6
      auto rest = model->forward(tokens.narrow(1, 34, 6), &tried);
      const double err = (rest - full.narrow(1, 34, 6)).abs().max().item<double>() / full.abs().max().item<double>();
      EXPECT_LT(err, dtype == torch::kDouble ? test_tol::kF64Paths : test_tol::kF32VsF64);
    }
  torch::manual_seed(7);
  Transformer model(tiny(Mechanism::path));
  KVCache empty;
  EXPECT_THROW(model->forward(torch::zeros({1, 3}, torch::kLong), &empty, false), std::invalid_argument);
}

// Generation (greedy against full forwards, sampling, checkpoints through the loader): test_model_generate.cpp.

TEST(Model, SaveLoadGivesIdenticalLogits) {
  auto dir = temp_dir("saveload");
  for (auto m : kAll) {
    torch::manual_seed(4);
    auto cfg = tiny(m);
    Transformer a(cfg);
    torch::save(a, (dir / "m.pt").string());
    torch::manual_seed(5);  // a different initialisation, overwritten by the load
    Transformer b(cfg);
    torch::load(b, (dir / "m.pt").string());
    auto tokens = torch::randint(0, cfg.vocab, {2, 33}, torch::kLong);
    torch::NoGradGuard ng;
    EXPECT_TRUE(torch::equal(a->forward(tokens), b->forward(tokens))) << label(m);
  }
  pathattn::model::remove_tree(dir);
}

// Causality of the whole model, every mechanism: tokens after position t change no logit before t (and do change
// the later ones). bench_step on the H200 saw PaTH-FoX's loss on one repeated random batch fall far faster than
// PaTH's and RoPE's: this rules out a leak from the future in the C++ layer, on the CPU op.
TEST(Model, LogitsBeforeTDependOnlyOnTokensBeforeT) {
  for (Mechanism m : kAll) {
    torch::manual_seed(8);
    auto cfg = tiny(m, 50);
    Transformer model(cfg);
    const int64_t T = 150, t = 77;  // t inside the second chunk of 64
    auto a = torch::randint(0, 40, {2, T}, torch::kLong);
    auto b = a.clone();
    b.narrow(1, t, T - t).random_(40, 50);  // different tokens, disjoint from those before t
    auto la = model->forward(a), lb = model->forward(b);
    EXPECT_TRUE(torch::equal(la.narrow(1, 0, t), lb.narrow(1, 0, t))) << label(m);
    EXPECT_FALSE(torch::equal(la.narrow(1, t, T - t), lb.narrow(1, t, T - t))) << label(m);
  }
}

TEST(Model, OverfitsOneBatch) {
  FlipFlopConfig fc;
  fc.pairs = 24;
  auto task = make_flipflop(fc);
  for (auto m : {Mechanism::path, Mechanism::rope}) {
    torch::manual_seed(6);
    auto cfg = tiny(m, task->vocab());
    cfg.d_model = 64;
    Transformer model(cfg);
    std::mt19937_64 rng(6);
    auto b = task->sample(8, rng);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
    double first = 0, last = 0;
    for (int s = 0; s < 150; ++s) {
      opt.zero_grad();
      auto loss = masked_loss(model->forward(b.input), b);
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);  // as the trainer does (TrainConfig::clip)
      opt.step();
      if (s == 0) first = loss.item<double>();
      last = loss.item<double>();
    }
    EXPECT_LT(last, test_tol::kOverfitRatio * first) << label(m) << ": loss " << first << " -> " << last;
    std::printf("  %s: loss %.4f -> %.4f\n", label(m).c_str(), first, last);
  }
}

TEST(Model, TinyFlipFlopRunBeatsChance) {
  FlipFlopConfig fc;
  fc.pairs = 16;
  auto task = make_flipflop(fc);
  torch::manual_seed(7);
  auto cfg = tiny(Mechanism::path, task->vocab());
  cfg.n_layer = 1;
  Transformer model(cfg);
  TrainConfig tc;
  tc.steps = 150;
  tc.batch = 16;
  tc.warmup = 10;
  tc.lr = 3e-3;
  tc.eval_every = 0;
  tc.eval_size = 128;
  tc.log_every = 0;
  auto r = train(model, *task, tc, "tiny");
  EXPECT_LT(r.final_eval.error.at("in_dist"), test_tol::kTinyRunError);
}

// TrainConfig::deterministic reaches the model's PaTH calls (train() applies it; the default is the fixed order), and
// train() always runs the op itself.
TEST(Model, TrainAppliesTheBackwardMode) {
  FlipFlopConfig fc;
  fc.pairs = 4;
  auto task = make_flipflop(fc);
  torch::manual_seed(7);
  Transformer model(tiny(Mechanism::path, task->vocab()));
  EXPECT_TRUE(model->path_run_options().deterministic_backward);
  PathRunOptions timing;  // a leftover timing substitute must not survive into training
  timing.sdpa_for_timing = true;
  model->set_path_run_options(timing);
  TrainConfig tc = short_train(1, 2, 4);
  tc.deterministic = false;
  train(model, *task, tc, "tiny");
  EXPECT_FALSE(model->path_run_options().deterministic_backward);
  EXPECT_FALSE(model->path_run_options().sdpa_for_timing);
  tc.deterministic = true;
  train(model, *task, tc, "tiny");
  EXPECT_TRUE(model->path_run_options().deterministic_backward);
}

// TrainConfig::torch_deterministic: cuBLAS's fixed workspace in the environment, torch's switch restored after
// train(), and two runs from one seed give the same weights (one thread: the CPU backward's bits depend on how its
// work is split). On CUDA, where the switch matters, test_model_cuda's ModelCudaTrain repeats a run bit for bit.
TEST(Model, TorchDeterministicRunRestoresTheSwitch) {
  FlipFlopConfig fc;
  fc.pairs = 8;
  auto task = make_flipflop(fc);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto run = [&] {
    torch::manual_seed(5);
    Transformer model(tiny(Mechanism::path, task->vocab()));
    TrainConfig tc = short_train(3, 2, 4);
    tc.torch_deterministic = true;
    train(model, *task, tc, "tiny");
    std::vector<torch::Tensor> p;
    for (const auto& t : model->parameters()) p.push_back(t.detach().flatten());
    return torch::cat(p);
  };
  ASSERT_FALSE(at::globalContext().deterministicAlgorithms());
  const auto a = run(), b = run();
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms()) << "train() must restore torch's switch";
  const char* ws = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  ASSERT_NE(ws, nullptr);
  EXPECT_STREQ(ws, ":4096:8");
}

// PathRunOptions::sdpa_for_timing (bench_step's path:sdpa rows) is exactly softmax attention on the PaTH layer's own
// q, k, v: the same logits as the nope model with the same projections, bit for bit (the zero-weighted term adds
// 0); and w, beta and g stay in the graph, so their parameters get (zero) gradients and their backward runs.
TEST(Model, SdpaForTimingIsSoftmaxOnThePathLayersProjections) {
  for (auto m : {Mechanism::path, Mechanism::path_fox}) {
    torch::manual_seed(3);
    Transformer path_model(tiny(m));
    Transformer nope(tiny(Mechanism::nope));
    {
      torch::NoGradGuard ng;
      auto from = path_model->named_parameters();
      for (auto& p : nope->named_parameters()) p.value().copy_(from[p.key()]);
    }
    PathRunOptions timing;
    timing.sdpa_for_timing = true;
    path_model->set_path_run_options(timing);
    auto tokens = torch::randint(0, 11, {2, 9}, torch::kLong);
    auto logits = path_model->forward(tokens);
    EXPECT_TRUE(torch::equal(logits, nope->forward(tokens))) << label(m);
    logits.square().sum().backward();
    for (const auto& p : path_model->named_parameters()) {
      const bool path_only = p.key().find("w_proj") != std::string::npos || p.key().find("w_conv1d") != std::string::npos ||
                             p.key().find("bt_proj") != std::string::npos || p.key().find("g_proj") != std::string::npos;
      ASSERT_TRUE(p.value().grad().defined()) << label(m) << ": " << p.key();
      if (path_only) EXPECT_EQ(p.value().grad().abs().max().item<double>(), 0.0) << label(m) << ": " << p.key();
    }
  }
}

// Training 12 steps straight equals 6 steps, a checkpoint, and 6 more steps after a resume.
TEST(Model, CheckpointResumeIsExact) {
  FlipFlopConfig fc;
  fc.pairs = 8;
  auto task = make_flipflop(fc);
  auto cfg = tiny(Mechanism::path, task->vocab());
  // This tests the trainer's resume, which must be bit-exact. The op's CPU backward is not bitwise reproducible
  // run to run with several threads (dq, dw, dbeta differed at ~1e-8 relative, measured): one thread here.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  TrainConfig tc;
  tc.steps = 12;
  tc.batch = 4;
  tc.warmup = 3;
  tc.eval_every = 6;
  tc.eval_size = 8;
  tc.log_every = 0;
  tc.ckpt_every = 6;
  auto dir = temp_dir("resume");
  torch::manual_seed(8);
  Transformer straight(cfg);
  train(straight, *task, tc, "straight");

  // Train to step 6 with a 12-step schedule, checkpoint, stop; then resume a fresh model from it.
  torch::manual_seed(8);
  Transformer six(cfg);
  auto to6 = tc;
  to6.out_dir = (dir / "six").string();
  to6.ckpt_every = 6;
  to6.stop_error = 2.0;  // stop at the first evaluation (step 6), after its checkpoint
  train(six, *task, to6, "six");
  torch::manual_seed(99);
  Transformer resumed(cfg);
  auto res = tc;
  res.out_dir = (dir / "six").string();
  res.resume = true;
  auto r = train(resumed, *task, res, "resumed");
  EXPECT_EQ(r.steps_done, 12);
  auto pa = straight->parameters(), pb = resumed->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::allclose(pa[i], pb[i], 0, 0)) << "parameter " << i;
  pathattn::model::remove_tree(dir);
  at::set_num_threads(threads);
}

TEST(Model, LearningRateSchedule) {
  TrainConfig tc;
  tc.steps = 100;
  tc.warmup = 10;
  tc.lr = 1.0;
  tc.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(tc, 0), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(tc, 9), 1.0);
  EXPECT_NEAR(lr_at(tc, 55), 0.55, 1e-12);  // half way through the cosine
  EXPECT_NEAR(lr_at(tc, 100), 0.1, 1e-12);
}

// The trainer's clipping without the host read: torch's clip_grad_norm_ bit for bit, when it clips (a norm far
// above max_norm) and when it does not, and with a parameter that has no gradient; on the foreach kernels
// (optim_step.h, the trainer's default) and per tensor.
TEST(Model, ClipWithoutSyncIsTorchsClip) {
  torch::manual_seed(3);
  for (bool foreach : {true, false})
  for (double max_norm : {0.5, 1e6}) {
    std::vector<torch::Tensor> a, b;
    for (auto shape : {std::vector<int64_t>{7, 5}, std::vector<int64_t>{13}, std::vector<int64_t>{2, 3, 4}}) {
      a.push_back(torch::randn(shape).requires_grad_());
      a.back().mutable_grad() = 10 * torch::randn(shape);
      b.push_back(a.back().detach().clone().requires_grad_());
      b.back().mutable_grad() = a.back().grad().clone();
    }
    a.push_back(torch::randn({3}).requires_grad_());  // no gradient
    b.push_back(a.back().detach().clone().requires_grad_());
    torch::nn::utils::clip_grad_norm_(a, max_norm);
    clip_grad_norm_no_sync(b, max_norm, foreach);
    for (size_t i = 0; i + 1 < a.size(); ++i)
      EXPECT_TRUE(torch::equal(a[i].grad(), b[i].grad()))
          << "gradient " << i << ", max_norm " << max_norm << ", foreach " << foreach;
    EXPECT_FALSE(b.back().grad().defined());
    if (max_norm < 1) {  // it did clip: the total norm is max_norm (to rounding)
      double sq = 0;
      for (size_t i = 0; i + 1 < b.size(); ++i) sq += b[i].grad().pow(2).sum().item<double>();
      EXPECT_NEAR(std::sqrt(sq), max_norm, 1e-5);
    }
  }
}

TEST(Model, BadConfigurationIsRejected) {
  ModelConfig c;
  c.vocab = 5;
  c.d_model = 30;
  c.n_head = 4;
  EXPECT_THROW(Transformer{c}, std::invalid_argument);
  EXPECT_THROW(parse_mechanism("alibi"), std::invalid_argument);
}

// dir_ops.h: the folder operations that replace std::filesystem's iterators (which crashed against torch 2.11's
// exported copies on the GPU machine).
TEST(DirOps, ListsSortedAndRemovesTreesWithoutFollowingLinks) {
  namespace fs = std::filesystem;
  const fs::path d = temp_dir("dirops");
  const fs::path outside = temp_dir("dirops_outside");
  std::ofstream(outside / "keep.txt") << "kept";
  fs::create_directories(d / "b" / "deep" / "deeper");
  std::ofstream(d / "c.txt") << "1";
  std::ofstream(d / "a.txt") << "2";
  std::ofstream(d / "b" / "deep" / "deeper" / "x.bin") << "3";
  fs::create_directory_symlink(outside, d / "b" / "link");
  EXPECT_EQ(list_folder(d.string()), (std::vector<std::string>{"a.txt", "b", "c.txt"}));
  EXPECT_EQ(list_folder((d / "b").string()), (std::vector<std::string>{"deep", "link"}));
  remove_tree(d.string());
  EXPECT_FALSE(fs::exists(d));
  EXPECT_TRUE(fs::exists(outside / "keep.txt")) << "remove_tree followed a symbolic link";
  EXPECT_NO_THROW(remove_tree(d.string()));  // absent: nothing to do
  std::ofstream(d.string() + ".file") << "f";
  remove_tree(d.string() + ".file");  // a plain file
  EXPECT_FALSE(fs::exists(d.string() + ".file"));
  try {
    list_folder(d.string());
    ADD_FAILURE() << "listing a missing folder did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(d.string()), std::string::npos) << e.what();
  }
  remove_tree(outside.string());
}

// A run that checkpoints at every step in one process (the GPU machine's crash was the second save's removal of
// the previous checkpoint): the last save is the one left, with no .tmp / .old folder beside it.
TEST(DirOps, RepeatedCheckpointsInOneRun) {
  namespace fs = std::filesystem;
  FlipFlopConfig fc;
  fc.pairs = 8;
  auto task = make_flipflop(fc);
  const fs::path d = temp_dir("ckpt_repeat");
  TrainConfig tc = short_train(5, 2, 4);
  tc.ckpt_every = 1;
  tc.out_dir = (d / "run").string();
  Transformer model(tiny(Mechanism::rope, task->vocab()));
  train(model, *task, tc, "repeat");
  EXPECT_EQ(read_checkpoint_info((d / "run" / "ckpt").string()).state.step, 5);
  EXPECT_EQ(list_folder((d / "run").string()), (std::vector<std::string>{"ckpt", "metrics.csv"}));
  remove_tree(d);
}
