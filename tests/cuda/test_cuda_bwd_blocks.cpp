// The two-level backward's schedule (src/cuda/bwd_blocks.h, which kernels/bwd_main.cuh and bwd_block_sweep.cuh run)
// on the host in f64 (label cpu): the main kernel's tasks level by level, the block preprocess (S_m, Q'_m, F_b) and
// the block gradient sweep (dPi, dQ' into dP, dQ^), with every decision taken from the header and the products done
// as the kernels do them. For a loss linear in the logits, L = sum over pairs of <ds_{m,c}, S_{m,c}> with random
// ds, every gradient the main kernel hands on (dQ^_m per query head, dK^_c, dP_m) must equal the per-chunk form's
// (blocks off), and the per-chunk form must equal finite differences of L. What nothing may read is NaN. The
// deterministic turns: each counter's adds come at turns 0, 1, .. from tasks c, c - 1, ...
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "cuda/block_sequence.h"
#include "cuda/bwd_blocks.h"

namespace pathattn::cuda {
namespace {

using namespace block_test;

// op(A) [n x k] op(B) [k x m], row-major, op = transpose where asked.
Mat mul(const Mat& a, bool ta, const Mat& b, bool tb, int n, int k, int m) {
  Mat out(n * m, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      double acc = 0;
      for (int l = 0; l < k; ++l) acc += (ta ? a[l * n + i] : a[i * k + l]) * (tb ? b[j * k + l] : b[l * m + j]);
      out[i * m + j] = acc;
    }
  return out;
}
void add(Mat& x, const Mat& y) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

struct Grads {
  std::vector<Mat> dq, dk, dp;  // dQ^ per (chunk, query head), dK^ and dP per chunk
};
// Who added to a counter at which turn: (kind, index) -> [(turn, task chunk)].
using Turns = std::map<std::pair<char, int>, std::vector<std::pair<int, int>>>;

// ds[(m, c) pair][head]: the loss's gradient by the logits S_{m,c} = Q~_{m,c} K^_c^T of query chunk m, key chunk c.
using Upstream = std::map<std::pair<int, int>, std::vector<Mat>>;

Upstream random_upstream(const Sequence& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  Upstream ds;
  for (int m = s.first; m <= s.last; ++m)
    for (int c = s.first; c < m; ++c)
      for (int hq = 0; hq < s.heads; ++hq) {
        Mat x(C * C);
        for (double& v : x) v = nd(rng);
        ds[{m, c}].push_back(x);
      }
  return ds;
}

// The per-pair logits by the definition (the forward's Eq. 15-16): Q^_m stepped through E_{m-1} .. E_{c+1}.
Mat pair_logits(const Sequence& s, int m, int c, int hq) {
  Mat q = s.qhat[(m - s.first) * s.heads + hq];
  for (int j = m - 1; j > c; --j) step(q, s.e[j - s.first], s.D, true);
  return logits(q, s.khat[c - s.first], s.D);
}
double loss(const Sequence& s, const Upstream& ds) {
  double l = 0;
  for (const auto& [mc, per_head] : ds)
    for (int hq = 0; hq < s.heads; ++hq) {
      const Mat x = pair_logits(s, mc.first, mc.second, hq);
      for (std::size_t i = 0; i < x.size(); ++i) l += x[i] * per_head[hq][i];
    }
  return l;
}

// The main kernel with its block kernels, as the CUDA code schedules them (block 0: the per-chunk kernel).
Grads backward(const Sequence& s, const Upstream& ds, int block, Turns* turns = nullptr) {
  const int D = s.D, G = s.heads, n = s.last - s.first + 1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto at = [&](int c) { return c - s.first; };
  Grads g{std::vector<Mat>(n * G, Mat(C * D, 0.0)), std::vector<Mat>(n, Mat(C * D, nan)), std::vector<Mat>(n, Mat(D * D, 0.0))};
  // Block preprocess: X = S_m^T from I (S_m = P_{m-1} .. P_s), Q'_m = Q^_m X^T, X <- X + X E_m; F = X - I after e.
  std::vector<Mat> xs(n, Mat(D * D, nan)), qf(n * G, Mat(C * D, nan)), fstep(n, Mat(D * D, nan));
  std::vector<Mat> dqf(n * G, Mat(C * D, 0.0)), dpi(n, Mat(D * D, 0.0));
  if (block > 0)
    for (int s0 = s.first; s0 <= s.last; s0 += block) {
      const BwdBlockItem it = bwd_block_item(s0, s.first, s.last, block);
      if (it.skip) continue;
      Mat x = identity(D);
      for (int m = it.s; m <= it.e; ++m) {
        xs[at(m)] = x;
        for (int hq = 0; hq < G; ++hq) qf[at(m) * G + hq] = mul(s.qhat[at(m) * G + hq], false, x, true, C, D, D);
        if (m < it.e || it.has_step) step(x, s.e[at(m)], D, false);
      }
      if (it.has_step) {
        for (int d = 0; d < D; ++d) x[d * D + d] -= 1;
        fstep[at(s0)] = x;
      }
    }
  // The main kernel's tasks.
  for (int c = s.first; c <= s.last; ++c) {
    const BwdLevels lv = BwdLevels::of(c, s.first, s.last, block);
    const auto step_of = [&](int i) -> const Mat& { return lv.is_far(i) ? fstep[at(lv.unit(i))] : s.e[at(lv.unit(i))]; };
    std::vector<Mat> slot;
    Mat k = s.khat[at(c)];
    for (int i = 0; i < lv.count(); ++i) {  // phase 1
      slot.push_back(k);
      if (i + 1 < lv.count()) step(k, step_of(i), D, false);
    }
    Mat e(C * D, 0.0);
    for (int i = lv.count() - 1; i >= 0; --i) {  // phase 2
      for (int m = lv.query_hi(i); m >= lv.query_lo(i); --m)
        for (int hq = 0; hq < G; ++hq) {
          const Mat& q = lv.is_far(i) ? qf[at(m) * G + hq] : s.qhat[at(m) * G + hq];
          const Mat want = pair_logits(s, m, c, hq), got = logits(q, slot[i], D);
          for (std::size_t r = 0; r < want.size(); ++r)
            EXPECT_NEAR(got[r], want[r], 1e-9 * (1 + std::abs(want[r]))) << "logits, block " << block << " m " << m << " c " << c;
          const Mat& d = ds.at({m, c})[hq];                  // [query][key]
          add(e, mul(d, true, q, false, C, C, D));           // E += ds^T Q
          add((lv.is_far(i) ? dqf : g.dq)[at(m) * G + hq], mul(d, false, slot[i], false, C, C, D));  // dQ += ds K~
          if (turns && hq == 0) (*turns)[{'q', m}].push_back({lv.query_turn(m), c});
        }
      if (i == 0) break;
      add((lv.is_far(i - 1) ? dpi : g.dp)[at(lv.unit(i - 1))], mul(e, true, slot[i - 1], false, D, C, D));
      if (turns) (*turns)[{lv.is_far(i - 1) ? 'b' : 'p', lv.unit(i - 1)}].push_back({lv.step_turn(i - 1), c});
      step(e, step_of(i - 1), D, true);  // E <- E + E step^T
    }
    g.dk[at(c)] = e;
  }
  // The block gradient sweep: G = dPi_b, for m = e .. s: dP_m += G X_m, dQ^_m += dQ'_m X_m, G <- G + E_m G + sum_h
  // Q^_m^T dQ'_m.
  if (block > 0)
    for (int s0 = s.first; s0 <= s.last; s0 += block) {
      const BwdBlockItem it = bwd_block_item(s0, s.first, s.last, block);
      if (it.skip) continue;
      Mat gm = it.has_step ? dpi[at(s0)] : Mat(D * D, 0.0);
      for (int m = it.e; m >= it.s; --m) {
        add(g.dp[at(m)], mul(gm, false, xs[at(m)], false, D, D, D));
        for (int hq = 0; hq < G; ++hq) add(g.dq[at(m) * G + hq], mul(dqf[at(m) * G + hq], false, xs[at(m)], false, C, D, D));
        if (m == it.s) break;
        add(gm, mul(s.e[at(m)], false, gm, false, D, D, D));
        for (int hq = 0; hq < G; ++hq) add(gm, mul(s.qhat[at(m) * G + hq], true, dqf[at(m) * G + hq], false, D, C, D));
      }
    }
  return g;
}

void expect_equal(const std::vector<Mat>& got, const std::vector<Mat>& want, const char* what, int block) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    double scale = 0;
    for (double v : want[i]) scale = std::max(scale, std::abs(v));
    for (std::size_t r = 0; r < want[i].size(); ++r)
      ASSERT_NEAR(got[i][r], want[i][r], 1e-9 * (1 + scale)) << what << " " << i << " element " << r << " block " << block;
  }
}

TEST(CudaBwdBlocks, TwoLevelGradientsEqualPerChunk) {
  const int D = 8;
  // 11 chunks, the last 20 rows short, from global chunk 5 (varlen's offsets); two query heads per kv head.
  const Sequence s = make_sequence(5, 11, 20, D, 11, 2);
  const Upstream ds = random_upstream(s, 3);
  const Grads want = backward(s, ds, 0);
  for (int block : {1, 2, 3, 4, 5, 10, 11, 16}) {
    const Grads got = backward(s, ds, block);
    expect_equal(got.dq, want.dq, "dQ^ (chunk x head)", block);
    expect_equal(got.dk, want.dk, "dK^ chunk", block);
    expect_equal(got.dp, want.dp, "dP chunk", block);
  }
}

// The per-chunk form (which the two-level one must equal) against finite differences of the loss in E, Q^ and K^.
TEST(CudaBwdBlocks, PerChunkGradientsEqualFiniteDifferences) {
  const int D = 4;
  Sequence s = make_sequence(0, 4, 9, D, 5, 2);
  const Upstream ds = random_upstream(s, 8);
  const Grads g = backward(s, ds, 0);
  const double h = 1e-5;
  auto central = [&](double& x) {
    const double x0 = x;
    x = x0 + h;
    const double lp = loss(s, ds);
    x = x0 - h;
    const double lm = loss(s, ds);
    x = x0;
    return (lp - lm) / (2 * h);
  };
  for (int j = 0; j < 4; ++j)
    for (int a : {0, 1, D - 1})
      for (int b : {0, 2}) {  // P_j^T = I + E_j, so d L / d E_j[a][b] = dP_j[b][a]
        const double fd = central(s.e[j][a * D + b]);
        EXPECT_NEAR(g.dp[j][b * D + a], fd, 1e-6 * (1 + std::abs(fd))) << "dP " << j;
      }
  for (int i : {0, 5, 4 * 2 - 1})
    for (int el : {0, 3 * D + 1, 50 * D + 2}) {
      const double fq = central(s.qhat[i][el]);
      EXPECT_NEAR(g.dq[i][el], fq, 1e-6 * (1 + std::abs(fq))) << "dQ^ " << i;
    }
  for (int c = 0; c < 4; ++c)
    for (int el : {0, 7 * D + 3, 54 * D}) {
      const double fk = central(s.khat[c][el]);
      EXPECT_NEAR(g.dk[c][el], fk, 1e-6 * (1 + std::abs(fk))) << "dK^ " << c;
    }
}

TEST(CudaBwdBlocks, TurnsComeInTaskOrder) {
  const int D = 4;
  const Sequence s = make_sequence(2, 9, 0, D, 1);
  const Upstream ds = random_upstream(s, 2);
  for (int block : {0, 1, 2, 3, 4, 9}) {
    Turns turns;
    backward(s, ds, block, &turns);
    for (auto& [counter, adds] : turns) {
      std::sort(adds.begin(), adds.end());
      for (std::size_t t = 0; t < adds.size(); ++t) {
        ASSERT_EQ(adds[t].first, static_cast<int>(t)) << counter.first << counter.second << " block " << block;
        ASSERT_EQ(adds[t].second, adds[0].second - static_cast<int>(t)) << counter.first << counter.second << " block " << block;
      }
    }
    // Every earlier key chunk adds to a query row's dQ, in order from the nearest.
    for (int m = s.first + 1; m <= s.last; ++m) {
      const auto& adds = turns[std::make_pair('q', m)];
      ASSERT_EQ(adds.size(), static_cast<std::size_t>(m - s.first)) << m;
      EXPECT_EQ(adds[0].second, m - 1);
    }
  }
}

TEST(CudaBwdBlocks, PairTasksShareLevelsAndTakeTurnsInOrder) {
  // The two-chunk kernel (kernels/bwd_main_pair.cuh): tasks c0 = first, first + 2, .. over blocks of an even size
  // (plan.h bwd_block_for). Chunk c0 + 1's level i must be c0's level i + 1 (the kernel steps both warpgroups
  // together), and every counter's adds, one per task with both chunks' contributions summed, must come at the
  // kernel's turns (query_turn / 2, step_turn / 2) as 0, 1, .. from tasks c0, c0 - 2, .., the nearest first.
  for (int first : {0, 3})
    for (int count : {1, 2, 7, 10, 12})
      for (int block : {0, 2, 4, 6}) {
        const int last = first + count - 1;
        Turns turns;
        for (int c0 = first; c0 <= last; c0 += 2) {
          const BwdLevels a = BwdLevels::of(c0, first, last, block);
          if (c0 + 1 <= last) {
            const BwdLevels b = BwdLevels::of(c0 + 1, first, last, block);
            ASSERT_EQ(b.count(), a.count() - 1) << c0 << " block " << block;
            for (int i = 0; i < b.count(); ++i) {
              EXPECT_EQ(b.is_far(i), a.is_far(i + 1)) << c0 << " " << i;
              EXPECT_EQ(b.unit(i), a.unit(i + 1)) << c0 << " " << i;
              EXPECT_EQ(b.query_lo(i), a.query_lo(i + 1)) << c0 << " " << i;
              EXPECT_EQ(b.query_hi(i), a.query_hi(i + 1)) << c0 << " " << i;
            }
          }
          // The compile-time form (BwdLevelsOf) agrees with the run-time one.
          const BwdLevelsOf<true> on(a);
          const BwdLevelsOf<false> off(BwdLevels::of(c0, first, last, 0));
          for (int i = 0; i < a.count(); ++i) {
            EXPECT_EQ(on.unit(i), a.unit(i));
            EXPECT_EQ(on.query_hi(i), a.query_hi(i));
            EXPECT_EQ(on.is_far(i), a.is_far(i));
          }
          for (int i = 0; i < off.count(); ++i) EXPECT_EQ(off.query_hi(i), BwdLevels::of(c0, first, last, 0).query_hi(i));
          for (int i = 0; i < a.count(); ++i) {
            for (int m = a.query_lo(i); m <= a.query_hi(i); ++m) turns[{'q', m}].push_back({a.query_turn(m) / 2, c0});
            if (i > 0) turns[{a.is_far(i - 1) ? 'b' : 'p', a.unit(i - 1)}].push_back({a.step_turn(i - 1) / 2, c0});
          }
        }
        for (auto& [counter, adds] : turns) {
          std::sort(adds.begin(), adds.end());
          for (std::size_t t = 0; t < adds.size(); ++t) {
            ASSERT_EQ(adds[t].first, static_cast<int>(t)) << counter.first << counter.second << " block " << block;
            ASSERT_EQ(adds[t].second, adds[0].second - 2 * static_cast<int>(t)) << counter.first << counter.second;
          }
        }
        for (int m = first + 1; m <= last; ++m)  // every task below a query row adds to its dQ once
          ASSERT_EQ(turns[std::make_pair('q', m)].size(), static_cast<std::size_t>((m - first + 1) / 2)) << m;
      }
}

TEST(CudaBwdBlocks, Levels) {
  // 10 chunks from global index 3 in blocks of 3: [3 4 5] [6 7 8] [9 10 11] [12].
  const BwdLevels a = BwdLevels::of(4, 3, 12, 3);
  EXPECT_EQ(a.near, 1);  // chunk 5
  EXPECT_EQ(a.far, 3);   // blocks at 6, 9, 12
  EXPECT_EQ(a.unit(0), 5);
  EXPECT_EQ(a.unit(1), 6);
  EXPECT_EQ(a.unit(3), 12);
  EXPECT_EQ(a.query_hi(2), 11);
  EXPECT_EQ(a.query_hi(3), 12);
  EXPECT_EQ(a.step_turn(2), 9 - 1 - 4);
  const BwdLevels b = BwdLevels::of(5, 3, 12, 3);  // a block's last chunk: far levels only
  EXPECT_EQ(b.near, 0);
  EXPECT_EQ(b.far, 3);
  EXPECT_EQ(BwdLevels::of(12, 3, 12, 3).count(), 0);  // the sequence's last chunk meets no query
  const BwdLevels off = BwdLevels::of(4, 3, 12, 0);
  EXPECT_EQ(off.near, 8);
  EXPECT_EQ(off.far, 0);
  for (int i = 0; i < off.count(); ++i) EXPECT_EQ(off.query_lo(i), off.query_hi(i));
  EXPECT_TRUE(bwd_block_item(3, 3, 12, 3).skip);
  EXPECT_TRUE(bwd_block_item(6, 3, 12, 3).has_step);
  EXPECT_FALSE(bwd_block_item(12, 3, 12, 3).has_step);
  EXPECT_FALSE(bwd_block_item(12, 3, 12, 3).skip);
}

}  // namespace
}  // namespace pathattn::cuda
