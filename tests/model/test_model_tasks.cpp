// Task generators checked against independent computations: flip-flop read bits by a scan, A5 running
// products by composing permutation arrays, MQRAR answers by a dictionary of histories.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "task.h"

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
