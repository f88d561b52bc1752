// Generation: the top-k and top-p filters on hand-worked examples, sampling frequencies, greedy generation through
// the KV cache against full forwards, the checkpoint round trip through the generate program's loader, flip-flop
// reads answered by generation, and bad arguments named in the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "checkpoint.h"
#include "config_io.h"
#include "dir_ops.h"
#include "generate.h"
#include "speculative.h"
#include "read_eval.h"
#include "test_util.h"
#include "tolerances_model.h"
#include "trainer.h"

using namespace pathattn::model;
using test_util::short_train;
using test_util::temp_dir;
using test_util::tiny;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

torch::Tensor row(std::vector<double> v) { return torch::tensor(v, torch::kDouble).view({1, -1}); }
torch::Tensor log_row(std::vector<double> p) { return row(p).log(); }
// Which entries of a filtered row survived (are finite).
std::vector<bool> kept(const torch::Tensor& filtered) {
  std::vector<bool> r;
  auto f = filtered.reshape({-1});
  for (int64_t i = 0; i < f.numel(); ++i) r.push_back(std::isfinite(f[i].item<double>()));
  return r;
}

// The message of the std::invalid_argument that f throws ("" when it throws none; another exception fails the test).
template <class F>
std::string error_of(F&& f) {
  return test_util::error_of<std::invalid_argument>(f);
}

// Scales every weight up: at N(0, 0.02) the logits barely depend on the context, so a wrong cache (a shifted rope
// position, a lost gate) would rarely change an argmax; scaled, attention is sharp and the continuation varies.
void sharpen(Transformer& model, double factor = 8.0) {
  torch::NoGradGuard ng;
  for (auto& p : model->parameters()) p.mul_(factor);
}

}  // namespace

TEST(ModelSampling, TopKKeepsTheKLargestAndTheirTies) {
  auto l = row({1, 3, 3, 2});
  EXPECT_EQ(kept(top_k_filter(l, 1)), (std::vector<bool>{false, true, true, false})) << "a tie at the k-th stays";
  EXPECT_EQ(kept(top_k_filter(l, 2)), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(kept(top_k_filter(l, 3)), (std::vector<bool>{false, true, true, true}));
  for (int64_t k : {0, 4, 10}) EXPECT_TRUE(torch::equal(top_k_filter(l, k), l)) << "k = " << k << ": unchanged";
  // Rows are filtered independently; kept logits keep their values, removed ones are -inf.
  auto two = torch::tensor({1.0, 3.0, 3.0, 2.0, 4.0, 0.0, -1.0, 2.0}, torch::kDouble).view({2, 4});
  auto f = top_k_filter(two, 2);
  EXPECT_TRUE(torch::equal(f, torch::tensor({-kInf, 3.0, 3.0, -kInf, 4.0, -kInf, -kInf, 2.0}, torch::kDouble).view({2, 4})));
}

TEST(ModelSampling, TopPKeepsTheSmallestNucleusAndItsTies) {
  // Probabilities 0.15, 0.5, 0.05, 0.3: sorted 0.5, 0.3, 0.15, 0.05, mass ahead of each 0, 0.5, 0.8, 0.95.
  auto l = log_row({0.15, 0.5, 0.05, 0.3});
  EXPECT_EQ(kept(top_p_filter(l, 0.4)), (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(kept(top_p_filter(l, 0.6)), (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(kept(top_p_filter(l, 0.9)), (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(kept(top_p_filter(l, 0.97)), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(kept(top_p_filter(l, 1e-9)), (std::vector<bool>{false, true, false, false})) << "the top token always stays";
  EXPECT_TRUE(torch::equal(top_p_filter(l, 1.0), l)) << "p = 1: unchanged";
  // p = 1 keeps a token whose predecessors' mass rounds to 1 (here 1 - 4e-18 in f64): the rule alone would drop it.
  EXPECT_EQ(kept(top_p_filter(row({0, -40}), 1.0)), (std::vector<bool>{true, true})) << "p = 1 keeps the tail";
  EXPECT_EQ(kept(top_p_filter(row({0, -40}), 0.999)), (std::vector<bool>{true, false}));
  auto f = top_p_filter(l, 0.6);  // kept logits keep their values (not renormalised)
  EXPECT_EQ(f[0][1].item<double>(), l[0][1].item<double>());
  EXPECT_EQ(f[0][3].item<double>(), l[0][3].item<double>());
  // Ties: 0.4, 0.2, 0.2, 0.2. p = 0.3 keeps the 0.4 alone; p = 0.5 reaches into the 0.2s, which are all kept.
  auto t = log_row({0.2, 0.4, 0.2, 0.2});
  EXPECT_EQ(kept(top_p_filter(t, 0.3)), (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(kept(top_p_filter(t, 0.5)), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(kept(top_p_filter(log_row({0.2, 0.3, 0.2, 0.3}), 0.1)), (std::vector<bool>{false, true, false, true}));
}

// Draws follow the filtered, temperature-scaled distribution: top-k 2 and top-p 0.7 of (0.5, 0.3, 0.2) both leave
// (0.625, 0.375, 0); temperature 2 turns (0.8, 0.2) into (2/3, 1/3); top-k 1 is greedy at any temperature.
TEST(ModelSampling, DrawsFollowTheFilteredDistribution) {
  const int n = test_tol::kSampleDraws;
  auto freq = [&](const torch::Tensor& logits1, SamplingConfig s) {
    auto gen = at::detail::createCPUGenerator(s.seed);
    auto draws = sample_next(logits1.to(torch::kFloat).expand({n, logits1.size(1)}).contiguous(), s, gen);  // [n, 1]
    EXPECT_EQ(draws.sizes(), (std::vector<int64_t>{n, 1}));
    return torch::bincount(draws.view({-1}), {}, logits1.size(1)).to(torch::kDouble) / n;
  };
  auto three = log_row({0.5, 0.3, 0.2});
  SamplingConfig s;
  s.temperature = 1.0;
  s.seed = 3;
  auto plain = freq(three, s);
  SamplingConfig k2 = s;
  k2.top_k = 2;
  SamplingConfig p7 = s;
  p7.top_p = 0.7;
  const std::vector<std::pair<std::string, std::vector<double>>> want = {{"plain", {0.5, 0.3, 0.2}},
                                                                          {"top_k 2", {0.625, 0.375, 0.0}},
                                                                          {"top_p 0.7", {0.625, 0.375, 0.0}}};
  const torch::Tensor got[] = {plain, freq(three, k2), freq(three, p7)};
  for (size_t c = 0; c < want.size(); ++c) {
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(got[c][j].item<double>(), want[c].second[j], test_tol::kSampleFreq) << want[c].first << " token " << j;
  }
  EXPECT_EQ(got[1][2].item<double>(), 0.0) << "top_k removed token 2";
  SamplingConfig t2 = s;
  t2.temperature = 2.0;
  auto ft = freq(log_row({0.8, 0.2}), t2);
  EXPECT_NEAR(ft[0].item<double>(), 2.0 / 3.0, test_tol::kSampleFreq);
  SamplingConfig k1 = s;
  k1.temperature = 50.0;
  k1.top_k = 1;
  EXPECT_EQ(freq(three, k1)[0].item<double>(), 1.0) << "top_k 1 is greedy";
}

// Greedy generation through the KV cache (prefill, then one decode step per token: the op's decode for PaTH) picks,
// at every step, the argmax of a full forward of the sequence so far without a cache. 70 tokens after a 12-token
// prompt pass the first growth of the op's decode room (prefill + 64).
TEST(ModelGenerate, GreedyWithTheCacheEqualsArgmaxOfFullForwards) {
  for (auto m : {Mechanism::path, Mechanism::path_fox, Mechanism::rope}) {
    torch::manual_seed(3);
    auto cfg = tiny(m);
    Transformer model(cfg);
    sharpen(model);
    const int64_t B = 4, n = 70;
    auto prompt = torch::randint(0, cfg.vocab, {B, 12}, torch::kLong);
    GenerateStats st;
    auto gen = generate(model, prompt, n, {}, &st);
    ASSERT_EQ(gen.sizes(), (std::vector<int64_t>{B, 12 + n}));
    EXPECT_TRUE(torch::equal(gen.narrow(1, 0, 12), prompt));
    torch::NoGradGuard ng;
    std::set<int64_t> distinct;
    for (int64_t t = 12; t < 12 + n; ++t) {
      auto want = model->forward(gen.narrow(1, 0, t)).select(1, -1).argmax(-1);  // [B]
      ASSERT_TRUE(torch::equal(gen.select(1, t), want)) << mechanism_name(m) << ": step " << t - 12;
      for (int64_t b = 0; b < B; ++b) distinct.insert(want[b].item<int64_t>());
    }
    EXPECT_GT(distinct.size(), 1u) << mechanism_name(m) << ": a constant continuation would test little";
    EXPECT_EQ(st.prefill_tokens, B * 12);
    EXPECT_EQ(st.decode_tokens, B * n);
    EXPECT_GT(st.prefill_s, 0.0);
    EXPECT_GT(st.decode_s, 0.0);
  }
}

// Greedy generation with prompt-lookup drafts (speculative.h) gives greedy generate()'s tokens, for every mechanism;
// the prompt repeats itself, so drafts exist and, where the model continues the repetition, are accepted (fewer
// steps than tokens). f64, so that scoring several tokens in one call rounds like single steps to ~1e-15.
TEST(ModelGenerate, SpeculativeGreedyEqualsGreedy) {
  int64_t accepted = 0;
  for (auto m : {Mechanism::path, Mechanism::path_fox, Mechanism::rope, Mechanism::fox, Mechanism::nope}) {
    torch::manual_seed(8);
    auto cfg = tiny(m);
    Transformer model(cfg);
    sharpen(model);
    model->to(torch::kDouble);
    auto motif = torch::randint(0, cfg.vocab, {1, 6}, torch::kLong);
    auto prompt = torch::cat({motif, motif, motif}, 1);  // [1, 18]
    const int64_t n = 40;
    auto want = generate(model, prompt, n);
    SpeculativeStats spec;
    GenerateStats st;
    auto got = generate_speculative(model, prompt, n, {.draft = 5, .ngram = 2}, &st, &spec);
    EXPECT_TRUE(torch::equal(got, want)) << mechanism_name(m) << "\n" << got << "\n" << want;
    EXPECT_EQ(st.decode_tokens, n);
    EXPECT_LE(spec.accepted, spec.drafted);
    EXPECT_EQ(spec.steps + spec.accepted, n - 1) << "each step feeds its pending token and the accepted drafts";
    accepted += spec.accepted;
  }
  EXPECT_GT(accepted, 0) << "no draft token was ever accepted: the test would not see a wrong acceptance";
  torch::manual_seed(9);
  Transformer model(tiny(Mechanism::path));
  EXPECT_THROW(generate_speculative(model, torch::zeros({2, 4}, torch::kLong), 3), std::invalid_argument);
  EXPECT_THROW(generate_speculative(model, torch::zeros({1, 4}, torch::kLong), 3, {.draft = 64}),
               std::invalid_argument);
}

TEST(ModelGenerate, SamplingFollowsTheSeed) {
  torch::manual_seed(5);
  auto cfg = tiny(Mechanism::path);
  Transformer model(cfg);
  auto prompt = torch::randint(0, cfg.vocab, {2, 12}, torch::kLong);
  SamplingConfig s;
  s.temperature = 1.0;
  s.top_k = 5;
  s.top_p = 0.9;
  s.seed = 42;
  auto a = generate(model, prompt, 16, s);
  EXPECT_TRUE(torch::equal(a, generate(model, prompt, 16, s))) << "the same seed must give the same tokens";
  s.seed = 43;
  EXPECT_FALSE(torch::equal(a, generate(model, prompt, 16, s))) << "another seed, other tokens";
  EXPECT_TRUE((a >= 0).all().item<bool>() && (a < cfg.vocab).all().item<bool>());
  EXPECT_EQ(generate(model, prompt, 0, s).sizes(), prompt.sizes()) << "n = 0 returns the prompt";
}

// A checkpoint written by the trainer (train() with out_dir, as pathattn_train runs it) and read back by
// load_checkpoint, the generate program's loader: the same configuration and task, the step, identical logits,
// from the run directory or its ckpt/.
// The configurations set every option away from its default, so a field the config file lost would change the
// model (a missing parameter, a different beta clamp, rope base or gate scale).
TEST(ModelCheckpoint, RoundTripThroughTheLoaderGivesIdenticalLogits) {
  auto path = tiny(Mechanism::path, 5);
  path.qk_norm = true;
  path.n_kv_head = 1;
  path.low_rank_w = false;
  path.beta_max = 0.9;  // binds: beta starts at 1
  path.conv_size = 4;
  path.mlp_hidden = 40;
  auto fox = tiny(Mechanism::path_fox, 5);
  fox.gate_scale = GateScale::fla;
  fox.w_shortconv = false;
  fox.w_rank = 8;
  auto rope = tiny(Mechanism::rope, 5);
  rope.n_head = 4;
  rope.rope_base = 500.0;
  TaskConfig task;
  task.flipflop.pairs = 8;
  task.flipflop.p_ignore = 0.7;
  auto dir = temp_dir("ckpt");
  for (const auto& cfg : {path, fox, rope}) {
    const std::string name = mechanism_name(cfg.mechanism);
    torch::manual_seed(9);
    Transformer model(cfg);
    TrainConfig tc = short_train(2, 2, 2);
    tc.out_dir = (dir / name).string();
    train(model, *make_task(task), tc, name);
    for (const auto& where : {dir / name, dir / name / "ckpt"}) {  // the run directory or its ckpt/
      auto ck = load_checkpoint(where.string());
      EXPECT_EQ(ck.info.state.step, 2) << name;
      EXPECT_EQ(ck.info.dir, (dir / name / "ckpt").string()) << name;
      EXPECT_EQ(config_to_text(ck.model->config(), ck.info.task), config_to_text(cfg, task)) << name;
      EXPECT_EQ(config_diff(ck.info.config, cfg), "") << name;
      EXPECT_FALSE(ck.model->is_training()) << name << ": loaded for inference";
      auto tokens = torch::randint(0, 5, {2, 30}, torch::kLong);
      torch::NoGradGuard ng;
      EXPECT_TRUE(torch::equal(ck.model->forward(tokens), model->forward(tokens))) << name;
    }
  }
  pathattn::model::remove_tree(dir);
  // Doubles survive the text exactly (17 significant digits), not only the short ones above.
  auto third = path;
  third.beta_max = 1.0 / 3.0;
  third.rope_base = 0.1 + 0.2;
  const RunConfig back = config_from_text(config_to_text(third, task), "test");
  EXPECT_EQ(back.model.beta_max, third.beta_max);
  EXPECT_EQ(back.model.rope_base, third.rope_base);
  EXPECT_EQ(back.task.name, "flipflop");
  EXPECT_EQ(back.task.flipflop.pairs, 8);
  EXPECT_EQ(back.task.flipflop.p_ignore, 0.7);
  // Every synthetic task reports the options it was made from (what the trainer records), and they survive the text.
  TaskConfig a5;
  a5.name = "a5";
  a5.a5.length = 9;
  TaskConfig mq;
  mq.name = "mqrar";
  mq.mqrar.n_back = 2;
  mq.mqrar.length = 40;
  mq.mqrar.keys = 5;
  mq.mqrar.values = 6;
  mq.mqrar.p_query = 0.3;
  TaskConfig a5b = a5;
  a5b.a5.bos = true;
  for (const auto& t : {task, a5, a5b, mq}) {
    const RunConfig rc = config_from_text(config_to_text(path, make_task(t)->config()), t.name);
    EXPECT_EQ(config_to_text(rc.model, rc.task), config_to_text(path, t)) << t.name;
  }
  // a5.bos came after the first A5 runs recorded their config.txt: absent, it is off (what those runs did).
  std::string old_text = config_to_text(path, a5b);
  old_text.erase(old_text.find("a5.bos=1\n"), std::string("a5.bos=1\n").size());
  const RunConfig old_run = config_from_text(old_text, "an older config.txt");
  EXPECT_FALSE(old_run.task.a5.bos);
  EXPECT_EQ(old_run.task.a5.length, 9);
}

// Reads answered by generation score exactly what the full forward predicts at each read (greedy): the answers are
// its argmax at the read positions, one by one. The model's weights are scaled up so that its answers vary with
// the context (a constant answer would not tell a misaligned feed from a right one).
TEST(ModelReadEval, AnswersAreTheFullForwardsArgmaxAtEachRead) {
  torch::manual_seed(11);
  auto cfg = tiny(Mechanism::path, 5);
  Transformer model(cfg);
  sharpen(model);
  std::mt19937_64 rng(4);
  std::vector<std::vector<int64_t>> seqs;
  for (int i = 0; i < 6; ++i) seqs.push_back(ff::sequence(24, 0.6, rng));
  auto r = score_flipflop_reads(model, seqs);
  std::vector<int64_t> want;
  int64_t correct = 0;
  torch::NoGradGuard ng;
  for (const auto& s : seqs) {
    auto logits = model->forward(torch::tensor(s, torch::kLong).view({1, -1}));  // [1, T, V]
    for (size_t t = 0; t + 1 < s.size(); t += 2) {
      if (s[t] != ff::R) continue;
      want.push_back(logits[0][t].argmax().item<int64_t>());
      correct += want.back() == s[t + 1];
    }
  }
  EXPECT_EQ(r.answers, want);
  EXPECT_EQ(r.reads, static_cast<int64_t>(want.size()));
  EXPECT_EQ(r.correct, correct);
  EXPECT_GT(std::set<int64_t>(want.begin(), want.end()).size(), 1u) << "the answers must vary for this test to bite";
  for (const auto& s : seqs) {  // the tokens fed: each sequence up to and including its last read
    int64_t last_read = -1;
    for (size_t t = 0; t < s.size(); t += 2)
      if (s[t] == ff::R) last_read = t;
    r.fed -= last_read + 1;
  }
  EXPECT_EQ(r.fed, 0);
}

TEST(ModelGenerate, BadArgumentsAreNamed) {
  auto bad = [](auto set) {
    SamplingConfig s;
    set(s);
    return error_of([&] { s.validate(); });
  };
  const double nan = std::nan("");
  for (double p : {0.0, -0.1, 1.5, nan})
    EXPECT_NE(bad([&](SamplingConfig& s) { s.top_p = p; }).find("top_p"), std::string::npos) << "top_p " << p;
  EXPECT_NE(bad([](SamplingConfig& s) { s.top_k = -1; }).find("top_k"), std::string::npos);
  for (double t : {-0.5, nan, kInf})
    EXPECT_NE(bad([&](SamplingConfig& s) { s.temperature = t; }).find("temperature"), std::string::npos) << "temperature " << t;
  EXPECT_EQ(bad([](SamplingConfig& s) { s.top_p = 1.0; s.top_k = 0; s.temperature = 0.0; }), "") << "the defaults are valid";
  EXPECT_NE(error_of([] { top_k_filter(row({1, 2}), -2); }).find("top_k"), std::string::npos);
  EXPECT_NE(error_of([] { top_p_filter(row({1, 2}), 2.0); }).find("top_p"), std::string::npos);

  // generate() checks its sampling config, n and the prompt's ids.
  torch::manual_seed(1);
  Transformer model(tiny(Mechanism::path));
  auto prompt = torch::randint(0, 11, {1, 4}, torch::kLong);
  SamplingConfig s;
  s.top_p = 0.0;
  EXPECT_NE(error_of([&] { generate(model, prompt, 2, s); }).find("top_p"), std::string::npos);
  EXPECT_NE(error_of([&] { generate(model, prompt, -1); }).find("n: expected >= 0"), std::string::npos);
  auto out_of_vocab = prompt.clone();
  out_of_vocab[0][2] = 11;
  const auto e = error_of([&] { generate(model, out_of_vocab, 2); });
  EXPECT_NE(e.find("tokens: id 11 at [0, 2]"), std::string::npos) << e;

  // load_checkpoint names the path and the missing file; a bad config.txt names its line and key.
  auto dir = temp_dir("badckpt");
  const std::string missing = (dir / "nothing_here").string();
  auto e1 = error_of([&] { load_checkpoint(missing); });
  EXPECT_NE(e1.find("checkpoint: '" + missing + "' is not a directory"), std::string::npos) << e1;
  auto e2 = error_of([&] { load_checkpoint(dir.string()); });
  EXPECT_NE(e2.find("'" + (dir / "step.txt").string() + "' not found"), std::string::npos) << e2;
  std::ofstream(dir / "step.txt") << "3\n";
  auto e3 = error_of([&] { load_checkpoint(dir.string()); });
  EXPECT_NE(e3.find("'" + (dir / "config.txt").string() + "' not found"), std::string::npos) << e3;
  const std::string config_txt = (dir / "config.txt").string();
  auto with_config = [&](const std::string& text) {
    std::ofstream(dir / "config.txt", std::ios::trunc) << text;
    return error_of([&] { load_checkpoint(dir.string()); });
  };
  auto e4 = with_config("mechanism=path\nvocab=5\nn_layers=2\n");
  EXPECT_NE(e4.find(config_txt + " line 3: unknown key 'n_layers'"), std::string::npos) << e4;
  // A whole config.txt with one field spoilt (the writer's order: vocab is line 1, mechanism 7, task 16).
  const std::string good = config_to_text(tiny(Mechanism::path, 5), TaskConfig{});
  auto spoilt = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    return with_config(t);
  };
  auto e5 = spoilt("vocab=5", "vocab=five");
  EXPECT_NE(e5.find(config_txt + " line 1: vocab expected an integer, got 'five'"), std::string::npos) << e5;
  auto e6 = spoilt("mechanism=path", "mechanism=alibi");
  EXPECT_NE(e6.find(config_txt + " line 7: mechanism: expected"), std::string::npos) << e6;
  auto e7 = spoilt("task=flipflop", "task=chess");
  EXPECT_NE(e7.find(config_txt + " line 16: task: expected flipflop, a5, mqrar or lm, got 'chess'"), std::string::npos)
      << e7;
  auto e8 = spoilt("flipflop.pairs=", "mqrar.keys=");  // an option of another task
  EXPECT_NE(e8.find(config_txt + " line 17: unknown key 'mqrar.keys'"), std::string::npos) << e8;
  auto e9 = spoilt("n_head=2\n", "");
  EXPECT_NE(e9.find(config_txt + ": missing key 'n_head'"), std::string::npos) << e9;
  auto e10 = spoilt("vocab=5", "vocab=0");  // parses, but is no model
  EXPECT_NE(e10.find(config_txt + ": vocab: expected > 0"), std::string::npos) << e10;
  // config.txt right: now model.pt is what is missing, then what does not load.
  auto e11 = with_config(good);
  EXPECT_NE(e11.find("'" + (dir / "model.pt").string() + "' not found"), std::string::npos) << e11;
  std::ofstream(dir / "model.pt") << "";
  auto e12 = error_of([&] { load_checkpoint(dir.string()); });
  EXPECT_NE(e12.find("'" + (dir / "model.pt").string() + "' does not load into the model of config.txt"),
            std::string::npos)
      << e12;
  pathattn::model::remove_tree(dir);
}
