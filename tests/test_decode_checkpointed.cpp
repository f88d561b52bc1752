// The checkpointed cache (docs/math.md Eq. 35-37, pathattn.h DecodeCache::ckpt): decoding a sequence in steps of any
// size on it gives the f64 reference forward over the whole sequence, and the plain cache's results; its keys,
// carried by the pending product (carry), are the forward's kcache; the checkpoint moves exactly every P tokens, per
// sequence. Periods 1 (a refresh every token: the plain cache's work), 3 and 64; beta near 0, 1 (singular H) and 2.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decode_steps.h"
#include "harness.h"
#include "tolerances.h"

namespace pathattn::test {
namespace {

struct CheckpointState : DecodeState {
  Buffer<int32_t> ckpt;
  Buffer<float> carry;  // [B, H, D, D]
  int64_t P, D;
  CheckpointState(const Spec& s, int64_t Tmax, int64_t period)
      : DecodeState(s, Tmax), ckpt({s.B}, DType::i32), carry({s.B, s.H, s.D, s.D}, DType::f32), P(period), D(s.D) {
    for (int64_t b = 0; b < s.B; ++b) ckpt.data()[b] = 0;
    for (int64_t i = 0; i < s.B * s.H * s.D * s.D; ++i) carry.data()[i] = (i / s.D) % s.D == i % s.D ? 1.f : 0.f;
  }
  DecodeCache view(bool gate) {
    DecodeCache c = DecodeState::view(gate);
    c.ckpt = ckpt.view;
    c.carry = carry.view;
    c.ckpt_period = P;
    return c;
  }
  // The plain cache's keys (decode_steps.h).
  std::vector<double> materialized_k(const Spec& s) {
    return materialized_keys(k.to_vector(), k.view.sizes[1], s.H, D, ckpt.to_vector(), lengths.to_vector(),
                             carry.to_vector());
  }
};

void decode_checkpointed_in_steps(Case<float>& c, CheckpointState& cache, int64_t start,
                                  const std::vector<int64_t>& steps, Buffer<float>& o, Buffer<float>& lse) {
  int64_t t0 = start;
  for (int64_t S : steps) {
    ForwardOutputs out{rows(o.view, t0, S), rows(lse.view, t0, S), {}};
    decode(step_inputs(c.in, t0, S), cache.view(c.P.spec.gate), out, Backend::cpu);
    t0 += S;
    // The invariant the decode keeps, and where the checkpoint must be: the last multiple of P tokens since the
    // previous one (sequences started together: every refresh at t + 1 - ckpt = P).
    for (int64_t b = 0; b < c.P.spec.B; ++b) {
      const int64_t len = cache.lengths.data()[b], ck = cache.ckpt.data()[b];
      ASSERT_EQ(len, t0);
      ASSERT_TRUE(ck <= len && len - ck < cache.P) << "ckpt " << ck << ", lengths " << len << ", P " << cache.P;
    }
  }
  ASSERT_EQ(t0, c.P.spec.T) << "the step sizes must cover the sequence";
}

struct Setting {
  bool gate;
  int64_t P;
  BetaDist beta;
};

class CheckpointedDecode : public ::testing::TestWithParam<Setting> {};

// From an empty cache, in steps of 1, a few and more than a chunk: the f64 reference forward, the plain cache.
TEST_P(CheckpointedDecode, StepsOfAnySizeMatchTheReferenceAndThePlainCache) {
  const Setting st = GetParam();
  const Spec s{.B = 2, .T = 150, .H = 2, .HQ = 4, .D = 16, .DV = 8, .gate = st.gate, .beta = st.beta, .seed = 61};
  Problem64 P(s);
  Case<float> c(P);
  const std::vector<int64_t> steps{37, 1, 1, 5, 70, 1, 2, 33};
  CheckpointState ck(s, s.T, st.P);
  DecodeState plain(s, s.T);
  Buffer<float> o({s.B, s.T, s.HQ, s.DV}, DType::f32), lse({s.B, s.T, s.HQ}, DType::f32);
  Buffer<float> po({s.B, s.T, s.HQ, s.DV}, DType::f32), plse({s.B, s.T, s.HQ}, DType::f32);
  decode_checkpointed_in_steps(c, ck, 0, steps, o, lse);
  decode_in_steps(c, plain, 0, steps, po, plse);

  Case<double> ref(P);
  ref.forward(Backend::reference, true);
  EXPECT_LT(rel_err(o.to_vector(), ref.o.to_vector()), tol::kF32VsF64) << "o";
  EXPECT_LT(rel_err(lse.to_vector(), ref.lse.to_vector()), tol::kF32VsF64) << "lse";
  EXPECT_LT(rel_err(o.to_vector(), po.to_vector()), tol::kF32VsF64) << "o vs the plain cache";
  EXPECT_LT(rel_err(ck.materialized_k(s), ref.kcache.to_vector()), tol::kF32VsF64) << "keys vs forward's kcache";
  EXPECT_LT(rel_err(ck.v.to_vector(), P.v), tol::kF32VsF64) << "cache.v";
  if (s.gate) EXPECT_LT(rel_err(ck.gcum.to_vector(), plain.gcum.to_vector()), tol::kF32VsF64) << "cache.gcum";
  EXPECT_TRUE(o.guards_intact() && lse.guards_intact() && ck.k.guards_intact() && ck.carry.guards_intact() &&
              ck.ckpt.guards_intact());
}

std::vector<Setting> settings() {
  return {{false, 1, BetaDist::uniform}, {true, 3, BetaDist::near1}, {false, 64, BetaDist::near2},
          {true, 64, BetaDist::uniform},  {true, 7, BetaDist::near0},  {false, 40, BetaDist::exact2}};
}
INSTANTIATE_TEST_SUITE_P(Periods, CheckpointedDecode, ::testing::ValuesIn(settings()), [](const auto& info) {
  return "P" + std::to_string(info.param.P) + (info.param.gate ? "_gate" : "") + "_beta" + beta_name(info.param.beta);
});

// Sequences at different phases: sequence 0 with 20 tokens pending, sequence 1 refreshed (its equivalent state with
// the checkpoint at its end); they then refresh at different tokens and still give the reference.
TEST(CheckpointedDecodeSequences, EachSequenceRefreshesOnItsOwn) {
  const Spec s{.B = 2, .T = 100, .H = 1, .HQ = 2, .D = 16, .DV = 16, .gate = true, .seed = 62};
  Problem64 P(s);
  Case<float> c(P);
  CheckpointState ck(s, s.T, 32);
  Buffer<float> o({s.B, s.T, s.HQ, s.DV}, DType::f32), lse({s.B, s.T, s.HQ}, DType::f32);
  ForwardOutputs first{rows(o.view, 0, 20), rows(lse.view, 0, 20), {}};
  decode(step_inputs(c.in, 0, 20), ck.view(true), first, Backend::cpu);
  ASSERT_EQ(ck.ckpt.data()[1], 0);
  const std::vector<double> mk = ck.materialized_k(s);
  const int64_t row = s.H * s.D, Tmax = s.T;
  for (int64_t j = 0; j < 20 * row; ++j) ck.k.data()[Tmax * row + j] = static_cast<float>(mk[Tmax * row + j]);
  ck.ckpt.data()[1] = 20;  // nothing pending for sequence 1: its carry (the 20 tokens' product) is now ignored
  decode_checkpointed_in_steps(c, ck, 20, {1, 13, 1, 30, 2, 33}, o, lse);
  EXPECT_NE(ck.ckpt.data()[0], ck.ckpt.data()[1]) << "the two sequences should be at different phases";
  Case<double> ref(P);
  ref.forward(Backend::reference, true);
  EXPECT_LT(rel_err(o.to_vector(), ref.o.to_vector()), tol::kF32VsF64) << "o";
  EXPECT_LT(rel_err(lse.to_vector(), ref.lse.to_vector()), tol::kF32VsF64) << "lse";
  EXPECT_LT(rel_err(ck.materialized_k(s), ref.kcache.to_vector()), tol::kF32VsF64) << "keys vs forward's kcache";
}

// The message contains the expected words (plain find: the GPU image's googletest has no gmock).
::testing::AssertionResult Mentions(const std::string& msg, const std::string& words) {
  if (msg.find(words) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << words << "\"";
}

TEST(CheckpointedDecodeSequences, BadCheckpointArgumentsAreNamed) {
  const Spec s{.B = 1, .T = 4, .H = 1, .HQ = 1, .D = 16, .DV = 16, .seed = 63};
  Problem64 P(s);
  Case<float> c(P);
  CheckpointState ck(s, 10, 4);
  Buffer<float> o({1, 4, 1, 16}, DType::f32), lse({1, 4, 1}, DType::f32);
  auto msg = [&](DecodeCache dc, bool commit = true) {
    try {
      decode(c.in, dc, {o.view, lse.view, {}}, Backend::cpu, commit);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  DecodeCache partial = ck.view(false);
  partial.carry = {};
  EXPECT_TRUE(Mentions(msg(partial), "needs both cache.ckpt and cache.carry"));
  DecodeCache no_period = ck.view(false);
  no_period.ckpt_period = 0;
  EXPECT_TRUE(Mentions(msg(no_period), "cache.ckpt_period must be >= 1 with a checkpointed cache, got 0"));
  ck.lengths.data()[0] = 5;
  ck.ckpt.data()[0] = 1;  // 4 pending >= P = 4
  EXPECT_TRUE(Mentions(msg(ck.view(false)), "cache.ckpt[0] = 1 must be in [lengths - P + 1, lengths] = [2, 5] (P = ckpt_period = 4)"));
  ck.ckpt.data()[0] = 6;  // past lengths
  EXPECT_TRUE(Mentions(msg(ck.view(false)), "cache.ckpt[0] = 6 must be in"));
  ck.ckpt.data()[0] = 5;
  DecodeCache wrong = ck.view(false);
  wrong.carry.sizes[3] = 8;
  EXPECT_TRUE(Mentions(msg(wrong), "cache.carry (output) must have shape [1, 1, 16, 16]"));
  EXPECT_TRUE(Mentions(msg(ck.view(false), false), "commit = false takes the plain cache, not a checkpointed one"));
  EXPECT_EQ(ck.lengths.data()[0], 5) << "a refused call must not advance the cache";
  EXPECT_EQ(ck.ckpt.data()[0], 5);
}

}  // namespace
}  // namespace pathattn::test
