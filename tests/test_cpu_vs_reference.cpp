// The fast CPU path (Backend::cpu, f32) against the reference (Backend::reference, f64) on the same inputs:
// forward (o, lse, kcache) and every gradient, guard bands, NaN, inputs left untouched; adversarial inputs;
// thread-count independence; permuted output views; one long sequence. The case table covers every value of each axis (T, D, DV != D, GQA,
// gate, beta distribution, varlen, permuted inputs, B > 1) without the full cross product, so that the file
// stays under ~90 s on 2 cores: the f64 reference backward is O(T^2 D) time and memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "harness.h"
#include "tolerances.h"

namespace pathattn::test {
namespace {

// One named output of both runs.
struct Compared {
  const char* name;
  std::vector<double> cpu, ref;
};

// The gradients of the CPU run c and the reference run r, paired by name (dg only with a gate).
std::vector<Compared> gradient_pairs(const Case<float>& c, const Case<double>& r, bool gate) {
  std::vector<Compared> g = {{"dq", c.dq.to_vector(), r.dq.to_vector()},
                             {"dk", c.dk.to_vector(), r.dk.to_vector()},
                             {"dv", c.dv.to_vector(), r.dv.to_vector()},
                             {"dw", c.dw.to_vector(), r.dw.to_vector()},
                             {"dbeta", c.dbeta.to_vector(), r.dbeta.to_vector()}};
  if (gate) g.push_back({"dg", c.dg.to_vector(), r.dg.to_vector()});
  return g;
}

// Every compared tensor below kF32VsF64 (relative L2) and free of NaN/inf (rel_err returns inf on any).
// Prints the worst one, so that the margin to the tolerance is visible in every run.
void expect_close(const std::vector<Compared>& xs, const Spec& s) {
  double worst = 0;
  const char* worst_name = "none, all exact zeros";
  for (const Compared& x : xs) {
    if (max_abs_err(x.ref, std::vector<double>(x.ref.size(), 0.0)) == 0.0) {  // zero in exact arithmetic
      EXPECT_LT(max_abs_err(x.cpu, x.ref), tol::kF32ExactZeroAbs) << x.name << " of " << s.name() << " must be 0";
      continue;
    }
    const double e = rel_err(x.cpu, x.ref);
    EXPECT_LT(e, tol::kF32VsF64) << x.name << " of " << s.name() << ": relative error " << e
                                 << " (max abs " << max_abs_err(x.cpu, x.ref) << ")";
    if (!(e <= worst)) worst = e, worst_name = x.name;
  }
  std::printf("    worst relative error %.2e (%s), tolerance %.0e\n", worst, worst_name, tol::kF32VsF64);
}

// The inputs' buffers (guards and values) after a call: the op must not write into its inputs.
template <typename S>
void expect_inputs_untouched(Case<S>& c) {
  const Problem64& P = c.P;
  EXPECT_TRUE(c.q.guards_intact() && c.k.guards_intact() && c.v.guards_intact() && c.w.guards_intact() &&
              c.beta.guards_intact() && c.g.guards_intact())
      << "write next to an input buffer";
  EXPECT_TRUE(c.q.to_vector() == P.q) << "q was modified";
  EXPECT_TRUE(c.k.to_vector() == P.k) << "k was modified";
  EXPECT_TRUE(c.v.to_vector() == P.v) << "v was modified";
  EXPECT_TRUE(c.w.to_vector() == P.w) << "w was modified";
  EXPECT_TRUE(c.beta.to_vector() == P.beta) << "beta was modified";
  if (P.spec.gate) EXPECT_TRUE(c.g.to_vector() == P.g) << "g was modified";
}

// The forward's outputs of the CPU path and the reference, paired for expect_close.
std::vector<Compared> forward_pairs(const Case<float>& c, const Case<double>& r) {
  return {{"o", c.o.to_vector(), r.o.to_vector()},
          {"lse", c.lse.to_vector(), r.lse.to_vector()},
          {"kcache", c.kcache.to_vector(), r.kcache.to_vector()}};
}

class CpuVsReference : public ::testing::TestWithParam<Spec> {};

TEST_P(CpuVsReference, ForwardAndBackward) {
  const Spec& s = GetParam();
  const Problem64 P = rounded_to_f32(s);
  Case<float> c(P);
  Case<double> r(P);
  r.dout.fill_from(c.dout.to_vector());  // the same dO in both (the f32 copy is exact in f64)

  c.forward(Backend::cpu);
  r.forward(Backend::reference);
  expect_close(forward_pairs(c, r), s);

  // Each backward uses its own forward's o and lse, as a training step would.
  c.backward(Backend::cpu);
  r.backward(Backend::reference);
  expect_close(gradient_pairs(c, r, s.gate), s);

  EXPECT_TRUE(c.guards_intact()) << "the CPU path wrote outside an output";
  EXPECT_TRUE(r.guards_intact()) << "the reference wrote outside an output";
  expect_inputs_untouched(c);
}

// A loss that uses lse too (dlse given to backward): the CPU path's delta_i - dlse_i against the reference's, on
// cases with several chunks, the gate, GQA, DV != D and a varlen batch.
TEST(CpuVsReferenceLse, BackwardWithLseGradient) {
  for (const Spec& s : {Spec{.B = 1, .T = 200, .H = 2, .HQ = 4, .D = 16, .DV = 24, .gate = true, .seed = 8},
                        Spec{.B = 2, .T = 65, .H = 1, .HQ = 1, .D = 64, .DV = 64, .beta = BetaDist::near2, .seed = 9},
                        Spec{.B = 1, .T = 140, .H = 1, .HQ = 2, .D = 32, .DV = 32, .gate = true,
                             .seqlens = {1, 70, 69}, .seed = 10}}) {
    SCOPED_TRACE(s.name());
    const Problem64 P = rounded_to_f32(s);
    Case<float> c(P);
    Case<double> r(P);
    r.dout.fill_from(c.dout.to_vector());  // the same dO and dlse in both (exact in f64)
    r.dlse.fill_from(c.dlse.to_vector());
    c.forward(Backend::cpu);
    r.forward(Backend::reference);
    c.backward_with_lse(Backend::cpu);
    r.backward_with_lse(Backend::reference);
    expect_close(gradient_pairs(c, r, s.gate), s);
    // The lse term matters: without it the gradients differ (so this test can fail).
    Case<float> c0(P);
    c0.forward(Backend::cpu);
    c0.backward(Backend::cpu);
    EXPECT_GT(rel_err(c0.dq.to_vector(), r.dq.to_vector()), 10 * tol::kF32VsF64);
  }
}

// Each axis value appears at least once; the large T and D go with few heads (cost ~ B H T^2 D in f64).
std::vector<Spec> cases() {
  using B = BetaDist;
  std::vector<Spec> c;
  // Degenerate lengths: a single token (only the diagonal, no Householder applied) and two tokens.
  c.push_back({.B = 2, .T = 1, .H = 1, .HQ = 1, .D = 16, .DV = 16});
  c.push_back({.B = 1, .T = 1, .H = 1, .HQ = 4, .D = 64, .DV = 32, .gate = true, .beta = B::near2});
  c.push_back({.B = 1, .T = 2, .H = 1, .HQ = 4, .D = 16, .DV = 16, .gate = true, .beta = B::near1});
  c.push_back({.B = 3, .T = 2, .H = 2, .HQ = 2, .D = 128, .DV = 128, .beta = B::near0, .permuted = true});
  // Around a chunk of 64: one short, exact, one over; each beta regime.
  c.push_back({.B = 1, .T = 63, .H = 1, .HQ = 1, .D = 64, .DV = 64, .beta = B::near0});
  c.push_back({.B = 2, .T = 63, .H = 2, .HQ = 8, .D = 16, .DV = 24, .gate = true, .beta = B::uniform});
  c.push_back({.B = 1, .T = 64, .H = 1, .HQ = 1, .D = 64, .DV = 64, .gate = true, .beta = B::near1});
  c.push_back({.B = 2, .T = 64, .H = 2, .HQ = 2, .D = 16, .DV = 16, .beta = B::near2, .permuted = true});
  c.push_back({.B = 2, .T = 65, .H = 1, .HQ = 1, .D = 64, .DV = 64, .beta = B::near2});
  c.push_back({.B = 1, .T = 65, .H = 1, .HQ = 4, .D = 128, .DV = 64, .gate = true, .beta = B::near0});
  // Several chunks.
  c.push_back({.B = 1, .T = 200, .H = 2, .HQ = 8, .D = 128, .DV = 128, .gate = true, .permuted = true});
  c.push_back({.B = 3, .T = 200, .H = 1, .HQ = 1, .D = 16, .DV = 48, .beta = B::near1});
  c.push_back({.B = 1, .T = 200, .H = 1, .HQ = 1, .D = 64, .DV = 16, .beta = B::near2, .seed = 2});
  // Long: products of up to 1000 factors, sums over 1000 keys.
  c.push_back({.B = 1, .T = 1000, .H = 1, .HQ = 1, .D = 64, .DV = 64, .gate = true});
  c.push_back({.B = 1, .T = 1000, .H = 1, .HQ = 4, .D = 16, .DV = 32, .beta = B::near2});
  c.push_back({.B = 1, .T = 1000, .H = 1, .HQ = 1, .D = 128, .DV = 128, .beta = B::near1});
  c.push_back({.B = 2, .T = 1000, .H = 2, .HQ = 8, .D = 64, .DV = 64, .gate = true, .beta = B::near0,
               .permuted = true});
  c.push_back({.B = 1, .T = 2048, .H = 1, .HQ = 1, .D = 32, .DV = 32, .gate = true, .seed = 3});
  // Packed varlen batches: length-1 sequences and sequences that straddle chunk boundaries.
  c.push_back({.B = 1, .T = 265, .H = 1, .HQ = 1, .D = 64, .DV = 64, .seqlens = {1, 70, 1, 129, 64}});
  c.push_back({.B = 1, .T = 265, .H = 2, .HQ = 8, .D = 16, .DV = 32, .gate = true, .seqlens = {1, 70, 1, 129, 64},
               .beta = B::near1, .permuted = true});
  c.push_back({.B = 1, .T = 259, .H = 1, .HQ = 4, .D = 128, .DV = 64, .gate = true,
               .seqlens = {64, 1, 65, 63, 1, 1, 64}, .beta = B::near0});
  c.push_back({.B = 1, .T = 3, .H = 1, .HQ = 1, .D = 16, .DV = 16, .seqlens = {1, 1, 1}, .beta = B::near2});
  return c;
}
INSTANTIATE_TEST_SUITE_P(Cases, CpuVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name() + "_s" + std::to_string(info.param.seed); });

// Adversarial inputs the random table does not reach: exact beta values (0: H = I, 1: a singular projection,
// 2: a reflection), repeated and nearly parallel directions (the chunk's triangular solve at its least
// favourable), peaky softmax, and gates whose cumulative sum G reaches -2 10^4 (G_i - G_j must keep its
// precision: docs/spec.md §6). Each is a Spec plus a change to the drawn inputs.
enum class Twist { exact_betas, repeated_w, parallel_w, peaky, strong_gate };

const char* twist_name(Twist t) {
  switch (t) {
    case Twist::exact_betas: return "exact_betas";
    case Twist::repeated_w: return "repeated_w";
    case Twist::parallel_w: return "parallel_w";
    case Twist::peaky: return "peaky";
    case Twist::strong_gate: return "strong_gate";
  }
  return "?";
}

struct Adversarial {
  Twist twist;
  Spec spec;
};

void apply(Twist t, Problem64& P) {
  const Spec& s = P.spec;
  const int64_t rows = s.B * s.T * s.H, D = s.D;
  std::mt19937_64 rng(s.seed + 99);
  std::normal_distribution<double> n01(0.0, 1.0);
  switch (t) {
    case Twist::exact_betas:  // 0, 1, 2, drawn, repeating
      for (int64_t r = 0; r < rows; ++r)
        if (r % 4 != 3) P.beta[r] = double(r % 4);
      break;
    case Twist::repeated_w:  // runs of 10 equal directions (per head: rows are [B, T, H])
      for (int64_t r = s.H * 10; r < rows; ++r)
        if ((r / s.H) % 10 != 0) std::copy_n(&P.w[(r - s.H) * D], D, &P.w[r * D]);
      break;
    case Twist::parallel_w:  // every direction within ~1e-3 of one, beta near 2
      for (int64_t r = 0; r < rows; ++r) {
        double nn = 0;
        for (int64_t d = 0; d < D; ++d) nn += (P.w[r * D + d] = (d == 0 ? 1.0 : 0.0) + 1e-3 * n01(rng)) * P.w[r * D + d];
        for (int64_t d = 0; d < D; ++d) P.w[r * D + d] /= std::sqrt(nn);
      }
      break;
    case Twist::peaky:  // logits ~ N(0, 8^2): softmax rows dominated by a few keys
      for (double& x : P.q) x *= 8.0;
      break;
    case Twist::strong_gate:  // g = -20 for the first half (G reaches -10 T), then g ~ -0.5 so that attention
      // spreads over a few keys: f32 cumulative sums would leave G_i - G_j an error of ulp(10 T) ~ 1e-3 there
      // (measured at T = 2000: o 1.8e-4, lse 2.9e-4 relative, failing); per-chunk offsets keep ~1e-7.
      for (size_t r = 0; r < P.g.size(); ++r)
        P.g[r] = r < P.g.size() / 2 ? -20.0 : -0.5 * (1.0 + 0.5 * std::tanh(n01(rng)));
      break;
  }
  // Rounded to f32 like every input here (see rounded_to_f32).
  for (std::vector<double>* x : {&P.q, &P.w, &P.beta, &P.g})
    for (double& e : *x) e = static_cast<double>(static_cast<float>(e));
}

class CpuVsReferenceAdversarial : public ::testing::TestWithParam<Adversarial> {};

TEST_P(CpuVsReferenceAdversarial, ForwardAndBackward) {
  const Spec& s = GetParam().spec;
  Problem64 P = rounded_to_f32(s);
  apply(GetParam().twist, P);
  Case<float> c(P);
  Case<double> r(P);
  r.dout.fill_from(c.dout.to_vector());
  c.forward(Backend::cpu);
  r.forward(Backend::reference);
  c.backward(Backend::cpu);
  r.backward(Backend::reference);
  std::vector<Compared> xs = {{"o", c.o.to_vector(), r.o.to_vector()},
                              {"lse", c.lse.to_vector(), r.lse.to_vector()},
                              {"kcache", c.kcache.to_vector(), r.kcache.to_vector()}};
  for (Compared& g : gradient_pairs(c, r, s.gate)) xs.push_back(std::move(g));
  expect_close(xs, s);
  EXPECT_TRUE(c.guards_intact());
}

std::vector<Adversarial> adversarial_cases() {
  using B = BetaDist;
  return {
      {Twist::exact_betas, {.B = 1, .T = 200, .H = 2, .HQ = 4, .D = 64, .DV = 64, .gate = true, .seed = 31}},
      {Twist::repeated_w, {.B = 1, .T = 200, .H = 2, .HQ = 2, .D = 32, .DV = 32, .seed = 32}},
      {Twist::repeated_w, {.B = 1, .T = 150, .H = 1, .HQ = 1, .D = 16, .DV = 16, .beta = B::near2, .seed = 33}},
      {Twist::parallel_w, {.B = 1, .T = 200, .H = 1, .HQ = 1, .D = 64, .DV = 64, .beta = B::near2, .seed = 34}},
      {Twist::parallel_w, {.B = 1, .T = 200, .H = 1, .HQ = 1, .D = 16, .DV = 16, .beta = B::near1, .seed = 35}},
      {Twist::peaky, {.B = 1, .T = 300, .H = 1, .HQ = 4, .D = 64, .DV = 64, .gate = true, .seed = 36}},
      {Twist::strong_gate, {.B = 1, .T = 2000, .H = 1, .HQ = 1, .D = 32, .DV = 32, .gate = true, .seed = 37}},
      {Twist::strong_gate, {.B = 1, .T = 1100, .H = 1, .HQ = 2, .D = 16, .DV = 16, .gate = true,
                            .seqlens = {1, 600, 499}, .seed = 38}},
  };
}
INSTANTIATE_TEST_SUITE_P(Cases, CpuVsReferenceAdversarial, ::testing::ValuesIn(adversarial_cases()),
                         [](const auto& info) {
                           return std::string(twist_name(info.param.twist)) + "_" + info.param.spec.name() + "_s" +
                                  std::to_string(info.param.spec.seed);
                         });

// Restores the thread count when a test ends, so that a failure cannot leak a setting into later tests.
struct ThreadCount {
  int prev;
  explicit ThreadCount(int n) : prev(set_num_threads(n)) {}
  ~ThreadCount() { set_num_threads(prev); }
};

// The two-level carry of the CPU backward (docs/math.md Eq. 47-50; PATHATTN_CPU_BWD_BLOCK chunks per block, the
// default from 16 chunks on): every gradient against the f64 reference under the same tolerance as the one-level
// form, and against the one-level form itself (PATHATTN_CPU_BWD_BLOCK=0), for blocks of 1 to 4 chunks: pairs across
// one and several blocks, a last block shorter than the others, GQA, the gate, varlen with sequences of 1 to 5
// chunks, D = 128 and DV != D. (Same-block pairs run the one-level code.)
struct BlockCase {
  Spec spec;
  int block;
};
void PrintTo(const BlockCase& b, std::ostream* os) { *os << b.spec.name() << "_block" << b.block; }

// Sets PATHATTN_CPU_BWD_BLOCK for one scope.
struct BlockChunks {
  explicit BlockChunks(int b) { setenv("PATHATTN_CPU_BWD_BLOCK", std::to_string(b).c_str(), 1); }
  ~BlockChunks() { unsetenv("PATHATTN_CPU_BWD_BLOCK"); }
};

class CpuTwoLevel : public ::testing::TestWithParam<BlockCase> {};

TEST_P(CpuTwoLevel, BackwardMatchesTheReferenceAndTheOneLevelForm) {
  const BlockCase& bc = GetParam();
  const Spec& s = bc.spec;
  const Problem64 P = rounded_to_f32(s);
  Case<float> c(P), one(P);
  Case<double> r(P);
  r.dout.fill_from(c.dout.to_vector());
  one.dout.fill_from(c.dout.to_vector());
  c.forward(Backend::cpu);
  one.forward(Backend::cpu);
  r.forward(Backend::reference);
  {
    BlockChunks b(bc.block);
    c.backward(Backend::cpu);
  }
  {
    BlockChunks b(0);  // one block per sequence: the per-chunk chain only
    one.backward(Backend::cpu);
  }
  r.backward(Backend::reference);
  expect_close(gradient_pairs(c, r, s.gate), s);
  // Against the one-level form: the same gradients to f32 rounding (relative L2, far below kF32VsF64).
  const std::vector<std::pair<const char*, std::pair<std::vector<double>, std::vector<double>>>> pairs = {
      {"dq", {c.dq.to_vector(), one.dq.to_vector()}},   {"dk", {c.dk.to_vector(), one.dk.to_vector()}},
      {"dv", {c.dv.to_vector(), one.dv.to_vector()}},   {"dw", {c.dw.to_vector(), one.dw.to_vector()}},
      {"dbeta", {c.dbeta.to_vector(), one.dbeta.to_vector()}}};
  for (const auto& [name, xy] : pairs)
    EXPECT_LT(rel_err(xy.first, xy.second), 1e-4) << name << " of " << s.name() << ", block " << bc.block
                                                   << ": two-level against one-level";
  EXPECT_TRUE(c.guards_intact()) << "the two-level backward wrote outside an output";
}

std::vector<BlockCase> two_level_cases() {
  // Without a gate, but for one case: the test's forget gates make every pair two chunks apart or more ~exp(-50)
  // of the near ones, so that the far pairs (the only ones the two-level form changes) would not be seen.
  using B = BetaDist;
  std::vector<BlockCase> c;
  for (int block : {1, 2, 3}) {
    c.push_back({{.B = 1, .T = 600, .H = 1, .HQ = 4, .D = 64, .DV = 32, .beta = B::near2}, block});
    c.push_back({{.B = 2, .T = 200, .H = 2, .HQ = 2, .D = 16, .DV = 16, .beta = B::near1}, block});
  }
  c.push_back({{.B = 1, .T = 465, .H = 2, .HQ = 8, .D = 16, .DV = 32, .seqlens = {1, 70, 1, 129, 64, 200},
                .beta = B::uniform},
               1});
  c.push_back({{.B = 1, .T = 400, .H = 1, .HQ = 1, .D = 128, .DV = 128, .seqlens = {90, 310}}, 2});
  c.push_back({{.B = 1, .T = 1000, .H = 1, .HQ = 1, .D = 64, .DV = 64, .beta = B::near0}, 4});
  c.push_back({{.B = 1, .T = 330, .H = 1, .HQ = 4, .D = 64, .DV = 32, .gate = true, .beta = B::near2}, 1});
  return c;
}
INSTANTIATE_TEST_SUITE_P(Cases, CpuTwoLevel, ::testing::ValuesIn(two_level_cases()), [](const auto& info) {
  return info.param.spec.name() + "_block" + std::to_string(info.param.block);
});

// The CPU path's results must not depend on how work is split over threads beyond the order of f32 sums.
TEST(CpuThreads, ResultsDoNotDependOnThreadCount) {
  const Spec s{.B = 2, .T = 150, .H = 2, .HQ = 4, .D = 64, .DV = 32, .gate = true, .seed = 11};
  const Problem64 P = rounded_to_f32(s);
  Case<float> one(P), two(P);
  {
    ThreadCount t(1);
    one.forward(Backend::cpu);
    one.backward(Backend::cpu);
  }
  {
    ThreadCount t(2);
    two.forward(Backend::cpu);
    two.backward(Backend::cpu);
  }
  for (auto [a, b, name] : {std::tuple{&one.o, &two.o, "o"}, {&one.lse, &two.lse, "lse"},
                            {&one.kcache, &two.kcache, "kcache"}, {&one.dq, &two.dq, "dq"}, {&one.dk, &two.dk, "dk"},
                            {&one.dv, &two.dv, "dv"}, {&one.dw, &two.dw, "dw"}, {&one.dbeta, &two.dbeta, "dbeta"},
                            {&one.dg, &two.dg, "dg"}}) {
    const double e = rel_err(a->to_vector(), b->to_vector());
    EXPECT_LT(e, tol::kThreadCountRounding) << name << ": 1 thread vs 2 threads, relative difference " << e;
  }
  EXPECT_TRUE(one.guards_intact() && two.guards_intact());
}

// Two calls with the same thread count give bitwise equal results (training runs must repeat exactly: a dynamic
// split of the backward's key-chunk tasks once made dq, dw, dbeta differ at 1e-8 between calls).
TEST(CpuThreads, RepeatedCallsAreBitwiseEqual) {
  const Spec s{.B = 1, .T = 400, .H = 2, .HQ = 4, .D = 32, .DV = 32, .gate = true, .seed = 12};
  const Problem64 P = rounded_to_f32(s);
  for (int threads : {1, 2, 3}) {
    ThreadCount t(threads);
    Case<float> a(P), b(P);
    for (Case<float>* c : {&a, &b}) {
      c->forward(Backend::cpu);
      c->backward(Backend::cpu);
    }
    for (auto [x, y, name] : {std::tuple{&a.o, &b.o, "o"}, {&a.lse, &b.lse, "lse"}, {&a.dq, &b.dq, "dq"},
                              {&a.dk, &b.dk, "dk"}, {&a.dv, &b.dv, "dv"}, {&a.dw, &b.dw, "dw"},
                              {&a.dbeta, &b.dbeta, "dbeta"}, {&a.dg, &b.dg, "dg"}})
      EXPECT_TRUE(x->to_vector() == y->to_vector()) << name << " differs between two calls with " << threads << " threads";
  }
}

// Outputs and gradients written through permuted (non-contiguous) views, [B, H, T, X] storage viewed as
// [B, T, H, X]: the same numbers as contiguous outputs (the layout must not change the arithmetic), guards intact.
TEST(CpuStrides, PermutedOutputsMatchContiguous) {
  const Spec s{.B = 2, .T = 130, .H = 2, .HQ = 4, .D = 32, .DV = 16, .gate = true, .permuted = true, .seed = 13};
  const Problem64 P = rounded_to_f32(s);
  Case<float> c(P);
  c.forward(Backend::cpu);
  c.backward(Backend::cpu);
  auto buf = [&](int64_t heads, int64_t dim) {
    return dim ? Buffer<float>({s.B, s.T, heads, dim}, DType::f32, true) : Buffer<float>({s.B, s.T, heads}, DType::f32, true);
  };
  Buffer<float> o = buf(s.HQ, s.DV), lse = buf(s.HQ, 0), kc = buf(s.H, s.D), dq = buf(s.HQ, s.D), dk = buf(s.H, s.D),
                dv = buf(s.H, s.DV), dw = buf(s.H, s.D), dbeta = buf(s.H, 0), dg = buf(s.HQ, 0);
  forward(c.in, {o.view, lse.view, kc.view}, Backend::cpu);
  backward(c.in, o.view, lse.view, c.dout.view, {dq.view, dk.view, dv.view, dw.view, dbeta.view, dg.view}, Backend::cpu);
  for (auto [strided, contiguous, name] :
       {std::tuple{&o, &c.o, "o"}, {&lse, &c.lse, "lse"}, {&kc, &c.kcache, "kcache"}, {&dq, &c.dq, "dq"},
        {&dk, &c.dk, "dk"}, {&dv, &c.dv, "dv"}, {&dw, &c.dw, "dw"}, {&dbeta, &c.dbeta, "dbeta"}, {&dg, &c.dg, "dg"}}) {
    const double e = rel_err(strided->to_vector(), contiguous->to_vector());
    EXPECT_LT(e, tol::kLayoutRounding) << name << ": permuted vs contiguous output, relative difference " << e;
    EXPECT_TRUE(strided->guards_intact()) << name;
  }
}

// A long sequence: 4096 Householder factors in one product, forward only (the f64 reference backward would
// keep T^2 D / 2 doubles = 1 GiB). The f64 forward keeps O(T D) and takes a few seconds.
TEST(CpuLongSequence, Forward4096) {
  const Spec s{.B = 1, .T = 4096, .H = 1, .HQ = 2, .D = 16, .DV = 16, .gate = true, .seed = 21};
  const Problem64 P = rounded_to_f32(s);
  Case<float> c(P);
  Case<double> r(P);
  c.forward(Backend::cpu);
  r.forward(Backend::reference);
  expect_close(forward_pairs(c, r), s);
  EXPECT_TRUE(c.guards_intact());
}

}  // namespace
}  // namespace pathattn::test
