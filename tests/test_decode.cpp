// Decoding (docs/spec.md §4) against the definition: feeding a sequence to decode() in steps of any size (one token,
// a few, more than a chunk) gives, step by step, the f64 reference forward over the whole sequence; the cache
// ends as the forward's kcache; a prefill by forward() continues by decode().
#include <gtest/gtest.h>

#include "decode_steps.h"
#include "harness.h"
#include "tolerances.h"

namespace pathattn::test {
namespace {

// The message contains the expected words (plain find: the GPU image's googletest has no gmock).
::testing::AssertionResult Mentions(const std::string& msg, const std::string& words) {
  if (msg.find(words) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << words << "\"";
}

void expect_matches_reference(const Problem64& P, Buffer<float>& o, Buffer<float>& lse, DecodeState& cache) {
  Case<double> ref(P);
  ref.forward(Backend::reference);
  EXPECT_LT(rel_err(o.to_vector(), ref.o.to_vector()), tol::kF32VsF64) << "o";
  EXPECT_LT(rel_err(lse.to_vector(), ref.lse.to_vector()), tol::kF32VsF64) << "lse";
  EXPECT_LT(rel_err(cache.k.to_vector(), ref.kcache.to_vector()), tol::kF32VsF64) << "cache.k vs forward's kcache";
  EXPECT_LT(rel_err(cache.v.to_vector(), P.v), tol::kF32VsF64) << "cache.v";
  for (int64_t b = 0; b < P.spec.B; ++b) EXPECT_EQ(cache.lengths.data()[b], P.spec.T);
  EXPECT_TRUE(o.guards_intact() && lse.guards_intact() && cache.k.guards_intact() && cache.v.guards_intact());
}

// Steps of 1 (a decoding step), 5 (speculative), 70 (more than a chunk: two UT factors) from an empty cache.
TEST(Decode, StepsOfAnySizeMatchTheForward) {
  for (bool gate : {false, true}) {
    const Spec s{.B = 2, .T = 130, .H = 2, .HQ = 4, .D = 16, .DV = 8, .gate = gate, .seed = 31};
    Problem64 P(s);
    Case<float> c(P);
    DecodeState cache(s, s.T);
    Buffer<float> o({s.B, s.T, s.HQ, s.DV}, DType::f32), lse({s.B, s.T, s.HQ}, DType::f32);
    decode_in_steps(c, cache, 0, {37, 1, 1, 1, 5, 70, 1, 14}, o, lse);
    SCOPED_TRACE(gate ? "with gate" : "no gate");
    expect_matches_reference(P, o, lse, cache);
  }
}

// A prompt through forward() (kcache, values and cumulative gates copied into the cache), then decoding.
TEST(Decode, ContinuesAForwardPrefill) {
  const Spec s{.B = 1, .T = 90, .H = 1, .HQ = 2, .D = 32, .DV = 32, .gate = true, .beta = BetaDist::near2, .seed = 32};
  const int64_t prompt = 66;
  Problem64 P(s);
  Case<float> c(P);
  DecodeState cache(s, s.T);
  Buffer<float> o({s.B, s.T, s.HQ, s.DV}, DType::f32), lse({s.B, s.T, s.HQ}, DType::f32);
  Buffer<float> kc({s.B, prompt, s.H, s.D}, DType::f32);
  forward(step_inputs(c.in, 0, prompt), {rows(o.view, 0, prompt), rows(lse.view, 0, prompt), kc.view}, Backend::cpu);
  for (int64_t t = 0; t < prompt; ++t) {
    for (int64_t d = 0; d < s.D; ++d) cache.k.data()[t * s.D + d] = kc.data()[t * s.D + d];
    for (int64_t d = 0; d < s.DV; ++d) cache.v.data()[t * s.DV + d] = float(P.v[t * s.DV + d]);
    for (int64_t j = 0; j < s.HQ; ++j)
      cache.gcum.data()[t * s.HQ + j] = (t ? cache.gcum.data()[(t - 1) * s.HQ + j] : 0.0) + P.g[t * s.HQ + j];
  }
  cache.lengths.data()[0] = prompt;
  decode_in_steps(c, cache, prompt, {1, 1, 3, 19}, o, lse);
  expect_matches_reference(P, o, lse, cache);
}

// commit = false (speculative decoding's verification) leaves the cache, gates and lengths exactly as they were;
// committing the same tokens afterwards continues as if the draft had never been tried (the cache equals one that
// only committed, and both match the reference). Calls of 1, 5 and 70 tokens (two chunks) from 30 cached tokens.
TEST(Decode, WithoutCommitTheSameOutputsAndTheCacheUntouched) {
  for (bool gate : {false, true}) {
    SCOPED_TRACE(gate ? "with gate" : "no gate");
    const Spec s{.B = 2, .T = 106, .H = 2, .HQ = 4, .D = 16, .DV = 8, .gate = gate, .seed = 34};
    Problem64 P(s);
    Case<float> c(P);
    const int64_t start = 30;
    DecodeState tried(s, s.T), committed(s, s.T);
    Buffer<float> o({s.B, s.T, s.HQ, s.DV}, DType::f32), lse({s.B, s.T, s.HQ}, DType::f32);
    Buffer<float> o2({s.B, s.T, s.HQ, s.DV}, DType::f32), lse2({s.B, s.T, s.HQ}, DType::f32);
    // Both caches hold the first 30 tokens.
    decode(step_inputs(c.in, 0, start), tried.view(gate), {rows(o.view, 0, start), rows(lse.view, 0, start), {}},
           Backend::cpu);
    decode(step_inputs(c.in, 0, start), committed.view(gate), {rows(o2.view, 0, start), rows(lse2.view, 0, start), {}},
           Backend::cpu);
    int64_t t0 = start;
    for (int64_t S : {1, 5, 70}) {
      SCOPED_TRACE("S = " + std::to_string(S));
      const std::vector<double> k0 = tried.k.to_vector(), v0 = tried.v.to_vector(), g0 = tried.gcum.to_vector();
      const Inputs step = step_inputs(c.in, t0, S);
      decode(step, tried.view(gate), {rows(o.view, t0, S), rows(lse.view, t0, S), {}}, Backend::cpu, false);
      EXPECT_EQ(tried.k.to_vector(), k0) << "cache.k";
      EXPECT_EQ(tried.v.to_vector(), v0) << "cache.v";
      EXPECT_EQ(tried.gcum.to_vector(), g0) << "cache.gcum";
      for (int64_t b = 0; b < s.B; ++b) EXPECT_EQ(tried.lengths.data()[b], t0) << "lengths[" << b << "]";
      decode(step, committed.view(gate), {rows(o2.view, t0, S), rows(lse2.view, t0, S), {}}, Backend::cpu);
      // Accept the whole draft: commit it on the tried cache too, which must then equal the committed one.
      decode(step, tried.view(gate), {rows(o.view, t0, S), rows(lse.view, t0, S), {}}, Backend::cpu);
      t0 += S;
    }
    EXPECT_EQ(o.to_vector(), o2.to_vector()) << "o";
    EXPECT_EQ(lse.to_vector(), lse2.to_vector()) << "lse";
    EXPECT_EQ(tried.k.to_vector(), committed.k.to_vector()) << "cache.k";
    expect_matches_reference(P, o2, lse2, committed);
  }
}

// The uncommitted call's o and lse equal the committing call's, bit for bit (the same code on a copy of the history).
TEST(Decode, WithoutCommitEqualsTheCommittedOutputs) {
  const Spec s{.B = 1, .T = 40, .H = 1, .HQ = 2, .D = 16, .DV = 16, .gate = true, .beta = BetaDist::near1, .seed = 35};
  Problem64 P(s);
  Case<float> c(P);
  DecodeState cache(s, s.T);
  Buffer<float> o({s.B, s.T, s.HQ, s.DV}, DType::f32), lse({s.B, s.T, s.HQ}, DType::f32);
  Buffer<float> od({1, 9, 2, 16}, DType::f32), ld({1, 9, 2}, DType::f32);
  decode(step_inputs(c.in, 0, 31), cache.view(true), {rows(o.view, 0, 31), rows(lse.view, 0, 31), {}}, Backend::cpu);
  decode(step_inputs(c.in, 31, 9), cache.view(true), {od.view, ld.view, {}}, Backend::cpu, false);
  decode(step_inputs(c.in, 31, 9), cache.view(true), {rows(o.view, 31, 9), rows(lse.view, 31, 9), {}}, Backend::cpu);
  const std::vector<double> all = o.to_vector(), alll = lse.to_vector(), d = od.to_vector(), dl = ld.to_vector();
  EXPECT_EQ(d, std::vector<double>(all.begin() + 31 * 2 * 16, all.end()));
  EXPECT_EQ(dl, std::vector<double>(alll.begin() + 31 * 2, alll.end()));
  expect_matches_reference(P, o, lse, cache);
}

TEST(Decode, BadCacheArgumentsAreNamed) {
  const Spec s{.B = 1, .T = 8, .H = 1, .HQ = 1, .D = 16, .DV = 16, .gate = true, .seed = 33};
  Problem64 P(s);
  Case<float> c(P);
  DecodeState cache(s, 10);
  Buffer<float> o({1, 8, 1, 16}, DType::f32), lse({1, 8, 1}, DType::f32);
  auto msg = [&](DecodeCache dc, Inputs in) {
    try {
      decode(in, dc, {o.view, lse.view, {}}, Backend::cpu);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  cache.lengths.data()[0] = 3;  // 3 + 8 > 10
  EXPECT_TRUE(Mentions(msg(cache.view(true), c.in), "cache.lengths[0] = 3 plus the 8 new tokens must fit"));
  cache.lengths.data()[0] = 0;
  EXPECT_TRUE(Mentions(msg(cache.view(false), c.in), "cache.gcum [B, Tmax, HQ] is required when g is given"));
  DecodeCache wrong = cache.view(true);
  wrong.v.sizes[3] = 3;
  EXPECT_TRUE(Mentions(msg(wrong, c.in), "cache.v (output) must have shape [1, 10, 1, 16]"));
  Inputs packed = c.in;
  packed.cu_seqlens = make_view(nullptr, DType::i32, {2});
  EXPECT_TRUE(Mentions(msg(cache.view(true), packed), "decode takes no cu_seqlens"));
  EXPECT_EQ(cache.lengths.data()[0], 0) << "a refused call must not advance the cache";
}

}  // namespace
}  // namespace pathattn::test
