// Task generators checked against independent computations: flip-flop read bits by a scan, A5 running
// products by composing permutation arrays, MQRAR answers by a dictionary of histories.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "task.h"
#include "trainer.h"
#include "transformer.h"

using namespace pathattn::model;

TEST(ModelTasks, FlipFlopReadBitsMatchAScan) {
  std::mt19937_64 rng(3);
  int64_t reads = 0, ignores = 0, instrs = 0;
  for (int rep = 0; rep < 50; ++rep) {
    auto s = ff::sequence(256, 0.8, rng);
    ASSERT_EQ(s.size(), 512u);
    EXPECT_EQ(s.front(), ff::W);
    EXPECT_EQ(s[510], ff::R);
    int64_t last = -1;
    for (size_t p = 0; p < 256; ++p) {
      const int64_t instr = s[2 * p], bit = s[2 * p + 1];
      ASSERT_TRUE(instr == ff::W || instr == ff::R || instr == ff::I);
      ASSERT_TRUE(bit == ff::B0 || bit == ff::B1);
      if (instr == ff::W) last = bit;
      if (instr == ff::R) {
        EXPECT_EQ(bit, last) << "read at pair " << p;
        ++reads;
      }
      if (p > 0 && p < 255) {
        ++instrs;
        ignores += instr == ff::I;
      }
    }
  }
  const double p_i = static_cast<double>(ignores) / instrs;
  EXPECT_NEAR(p_i, 0.8, 0.02);
  EXPECT_GT(reads, 50);
}

TEST(ModelTasks, FlipFlopBatchMasksTheBitsAfterReads) {
  FlipFlopConfig cfg;
  cfg.pairs = 32;
  auto task = make_flipflop(cfg);
  std::mt19937_64 rng(5);
  auto b = task->sample(8, rng);
  ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{8, 63}));
  for (int64_t i = 0; i < 8; ++i) {
    int64_t last = -1;
    for (int64_t t = 0; t < 63; ++t) {
      const int64_t x = b.input[i][t].item<int64_t>(), y = b.target[i][t].item<int64_t>();
      if (t + 1 < 63) EXPECT_EQ(y, b.input[i][t + 1].item<int64_t>());
      const bool is_read = t % 2 == 0 && x == ff::R;
      EXPECT_EQ(b.mask[i][t].item<bool>(), is_read);
      if (t % 2 == 0 && x == ff::W) last = y;
      if (is_read) EXPECT_EQ(y, last);
    }
  }
  auto sets = task->eval_sets(4, 1);
  ASSERT_EQ(sets.size(), 3u);
  EXPECT_EQ(sets[0].name, "in_dist");
}

namespace {
using Perm = std::array<int, 5>;
Perm compose(const Perm& a, const Perm& b) {  // (a b)[i] = a[b[i]]
  Perm c;
  for (int i = 0; i < 5; ++i) c[i] = a[b[i]];
  return c;
}
bool is_even(const Perm& p) {  // parity by counting cycles: sign = (-1)^(5 - cycles)
  std::array<bool, 5> seen{};
  int cycles = 0;
  for (int i = 0; i < 5; ++i) {
    if (seen[i]) continue;
    ++cycles;
    for (int j = i; !seen[j]; j = p[j]) seen[j] = true;
  }
  return (5 - cycles) % 2 == 0;
}
}  // namespace

TEST(ModelTasks, A5ElementsAreTheSixtyEvenPermutations) {
  const auto& e = a5::elements();
  ASSERT_EQ(e.size(), 60u);
  std::set<Perm> distinct(e.begin(), e.end());
  EXPECT_EQ(distinct.size(), 60u);
  for (const auto& p : e) EXPECT_TRUE(is_even(p));
}

TEST(ModelTasks, A5TargetsAreRunningProductsOfArrays) {
  A5Config cfg;
  cfg.length = 20;
  auto task = make_a5(cfg);
  std::mt19937_64 rng(11);
  auto b = task->sample(16, rng);
  const auto& e = a5::elements();
  for (int64_t i = 0; i < 16; ++i) {
    Perm cur{0, 1, 2, 3, 4};
    for (int64_t t = 0; t < 20; ++t) {
      cur = compose(cur, e[b.input[i][t].item<int64_t>()]);
      EXPECT_EQ(e[b.target[i][t].item<int64_t>()], cur) << "sequence " << i << " position " << t;
    }
  }
  EXPECT_TRUE(b.mask.all().item<bool>());
}

// The same targets by another route: each element as a 5 x 5 permutation matrix M_p (column i has its 1 in row
// p[i], so M_a M_b is the matrix of a after b, i.e. of (a b)[i] = a[b[i]]), the running product as a matrix product,
// the element read back from the product's columns. Random sequences of several lengths, training batches and the
// evaluation set; independent of a5::mul and of the array composition above.
TEST(ModelTasks, A5TargetsEqualPermutationMatrixProducts) {
  const auto& e = a5::elements();
  auto matrix = [&](int64_t idx) {
    auto m = torch::zeros({5, 5}, torch::kDouble);
    for (int i = 0; i < 5; ++i) m[e[idx][i]][i] = 1.0;
    return m;
  };
  auto element_of = [&](const torch::Tensor& m) {
    Perm p;
    for (int i = 0; i < 5; ++i) p[i] = static_cast<int>(m.select(1, i).argmax().item<int64_t>());
    return p;
  };
  int64_t checked = 0;
  for (int64_t len : {1, 2, 5, 10, 20, 33}) {
    A5Config cfg;
    cfg.length = len;
    auto task = make_a5(cfg);
    ASSERT_EQ(task->seq_len(), len);
    ASSERT_EQ(task->vocab(), 60);
    std::mt19937_64 rng(1000 + len);
    std::vector<Batch> batches{task->sample(24, rng)};
    for (const auto& s : task->eval_sets(24, 5)) batches.push_back(s.data);
    for (const auto& b : batches) {
      ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{24, len}));
      EXPECT_TRUE(b.mask.all().item<bool>()) << "every position is scored";
      for (int64_t i = 0; i < 24; ++i) {
        auto prod = torch::eye(5, torch::kDouble);
        for (int64_t t = 0; t < len; ++t) {
          prod = torch::matmul(prod, matrix(b.input[i][t].item<int64_t>()));
          ASSERT_EQ(e[b.target[i][t].item<int64_t>()], element_of(prod))
              << "length " << len << ", sequence " << i << ", position " << t;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 24 * (1 + 2 + 5 + 10 + 20 + 33));
}

// score_batch on logits made by hand: token errors, sequence errors (a sequence is wrong when any scored position
// is), positions outside the mask ignored, a sequence without scored positions not counted, prefix counts.
TEST(ModelTasks, ScoreBatchCountsPositionsSequencesAndPrefixes) {
  // 4 sequences of 3 positions, vocabulary 2; target 1 everywhere. Predicted (argmax) and masks:
  //   seq 0: predicts 1 1 1, all scored           -> right
  //   seq 1: predicts 1 0 1, all scored           -> wrong at t = 1
  //   seq 2: predicts 0 1 1, t = 0 not scored     -> right (the wrong t = 0 is outside the mask)
  //   seq 3: predicts 0 0 0, nothing scored       -> not a sequence
  const int pred[4][3] = {{1, 1, 1}, {1, 0, 1}, {0, 1, 1}, {0, 0, 0}};
  const bool mask[4][3] = {{true, true, true}, {true, true, true}, {false, true, true}, {false, false, false}};
  auto logits = torch::zeros({4, 3, 2});
  Batch b{torch::zeros({4, 3}, torch::kLong), torch::ones({4, 3}, torch::kLong), torch::zeros({4, 3}, torch::kBool)};
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < 3; ++t) {
      logits[i][t][pred[i][t]] = 1.0;
      b.mask[i][t] = mask[i][t];
    }
  const auto c = score_batch(logits, b);
  EXPECT_EQ(c.scored, 8);
  EXPECT_EQ(c.wrong, 1);
  EXPECT_EQ(c.sequences, 3);
  EXPECT_EQ(c.seq_wrong, 1);
  EXPECT_EQ(c.pos_scored, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(c.pos_right, (std::vector<int64_t>{2, 2, 3}));
  // prefix 0..t all right: seq 0 always, seq 1 only at t = 0, seq 2 and 3 vacuously / always.
  EXPECT_EQ(c.prefix_right, (std::vector<int64_t>{4, 3, 3}));
}

TEST(ModelTasks, MqrarAnswersMatchADictionaryOfHistories) {
  for (int64_t n = 1; n <= 4; ++n) {
    MqrarConfig cfg;
    cfg.n_back = n;
    auto task = make_mqrar(cfg);
    std::mt19937_64 rng(100 + n);
    auto b = task->sample(4, rng);
    const int64_t K = cfg.keys, V = cfg.values, T = cfg.length - 1;
    ASSERT_EQ(b.input.size(1), T);
    int64_t queries = 0;
    for (int64_t i = 0; i < 4; ++i) {
      std::map<int64_t, std::vector<int64_t>> hist;
      std::vector<int64_t> s;
      for (int64_t t = 0; t < T; ++t) s.push_back(b.input[i][t].item<int64_t>());
      s.push_back(b.target[i][T - 1].item<int64_t>());
      for (int64_t p = 0; p + 1 < static_cast<int64_t>(s.size()); p += 2) {
        const int64_t a = s[p], c = s[p + 1];
        ASSERT_TRUE(c >= K && c < K + V) << "second token of a pair must be a value";
        if (a < K) {
          hist[a].push_back(c - K);
          EXPECT_FALSE(b.mask[i][p].item<bool>());
        } else {
          ASSERT_LT(a, 2 * K + V);
          const auto& h = hist[a - K - V];
          ASSERT_GE(static_cast<int64_t>(h.size()), n) << "query of a key with fewer than N assignments";
          EXPECT_EQ(c - K, h[h.size() - n]);
          EXPECT_TRUE(b.mask[i][p].item<bool>());
          ++queries;
        }
        if (p + 1 < T) EXPECT_FALSE(b.mask[i][p + 1].item<bool>()) << "a value position is never scored";
      }
    }
    EXPECT_GT(queries, 100) << "N = " << n;
  }
}

// With bos, a BOS token (60) comes first and is not scored; the elements after it are the draws of the form without it
// (the same generator state gives the same sequence), and the targets their running products.
TEST(ModelTasks, A5WithBosPutsAnUnscoredTokenFirst) {
  A5Config plain, with;
  plain.length = with.length = 7;
  with.bos = true;
  auto tp = make_a5(plain), tb = make_a5(with);
  EXPECT_EQ(tb->vocab(), 61);
  EXPECT_EQ(tb->seq_len(), 8);
  std::mt19937_64 r1(5), r2(5);
  const Batch a = tp->sample(32, r1), b = tb->sample(32, r2);
  ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{32, 8}));
  EXPECT_TRUE((b.input.select(1, 0) == 60).all().item<bool>());
  EXPECT_FALSE(b.mask.select(1, 0).any().item<bool>()) << "the BOS position is not scored";
  EXPECT_TRUE(b.mask.narrow(1, 1, 7).all().item<bool>());
  EXPECT_TRUE(torch::equal(b.input.narrow(1, 1, 7), a.input));
  EXPECT_TRUE(torch::equal(b.target.narrow(1, 1, 7), a.target));
  for (const auto& s : tb->eval_sets(16, 3)) {
    EXPECT_TRUE((s.data.input.select(1, 0) == 60).all().item<bool>()) << s.name;
    EXPECT_FALSE(s.data.mask.select(1, 0).any().item<bool>()) << s.name;
  }
}

// Why A5 takes a BOS token: without one, position 1 of x, x, ... sees exactly what position 0 does (the values it
// averages are all equal, whatever weights the position encoding gives them), so every mechanism must answer x there
// too, where x x is asked. Randomly initialised models of each mechanism give equal logits at the two positions (to
// f32 rounding); after a BOS token the two positions differ.
TEST(ModelTasks, A5RepeatedFirstTokenIsIndistinguishableWithoutBos) {
  for (Mechanism m : {Mechanism::path, Mechanism::path_fox, Mechanism::rope, Mechanism::fox, Mechanism::nope}) {
    ModelConfig c;
    c.vocab = 61;
    c.n_layer = 2;
    c.d_model = 64;
    c.n_head = 2;
    c.mechanism = m;
    torch::manual_seed(3);
    Transformer model(c);
    torch::NoGradGuard ng;
    model->eval();
    const auto plain = model->forward(torch::tensor({{17, 17, 5, 42}}, torch::kLong))[0];        // [T, V]
    const auto with = model->forward(torch::tensor({{60, 17, 17, 5, 42}}, torch::kLong))[0];
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return (a - b).norm().item<double>() / b.norm().item<double>();
    };
    EXPECT_LT(rel(plain[1], plain[0]), 1e-5) << mechanism_name(m) << ": positions 0 and 1 of x, x should be alike";
    EXPECT_GT(rel(with[2], with[1]), 1e-3) << mechanism_name(m) << ": after BOS, positions 1 and 2 should differ";
  }
}

TEST(ModelTasks, BadConfigurationsAreRejected) {
  FlipFlopConfig f;
  f.pairs = 1;
  EXPECT_THROW(make_flipflop(f), std::invalid_argument);
  MqrarConfig m;
  m.length = 7;
  EXPECT_THROW(make_mqrar(m), std::invalid_argument);
  A5Config a;
  a.length = 0;
  EXPECT_THROW(make_a5(a), std::invalid_argument);
}
