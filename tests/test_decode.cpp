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
