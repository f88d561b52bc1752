// The libtorch decoding entry points: DecodeState::from_prefill + decode() in steps of 1 and several tokens equal
// path_attention over the whole sequences (CPU f32), with the gate (f64 cumulative gates) and GQA.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tolerances.h"
#include "torch/pathattn_torch.h"

namespace {

using torch::Tensor;

// B random sequences of T tokens (unit w, beta in [0, 2), gates < 0), the first T0 of them through path_attention_ex
// (its kcache), and decode() on rows [t, t + s).
struct Sequences {
  Tensor q, k, v, w, beta, g, kcache;
  int64_t T0;
  Sequences(int64_t B, int64_t T, int64_t T0_, int64_t H, int64_t HQ, int64_t D, int64_t DV) : T0(T0_) {
    q = torch::randn({B, T, HQ, D});
    k = torch::randn({B, T, H, D});
    v = torch::randn({B, T, H, DV});
    w = torch::nn::functional::normalize(torch::randn({B, T, H, D}),
                                         torch::nn::functional::NormalizeFuncOptions().dim(-1));
    beta = 2 * torch::rand({B, T, H});
    g = -torch::rand({B, T, HQ});
    kcache = pathattn::path_attention_ex(rows(q, 0, T0), rows(k, 0, T0), rows(v, 0, T0), rows(w, 0, T0),
                                         rows(beta, 0, T0), rows(g, 0, T0), std::nullopt, std::nullopt, true)
                 .kcache;
  }
  static Tensor rows(const Tensor& x, int64_t t0, int64_t n) { return x.narrow(1, t0, n); }
  // The state after the prefill, room for Tmax tokens; checkpointed with period > 0.
  pathattn::DecodeState state(int64_t Tmax, int64_t period = 0) const {
    return pathattn::DecodeState::from_prefill(kcache, rows(v, 0, T0), rows(g, 0, T0), Tmax, period);
  }
  pathattn::DecodeOutput decode(pathattn::DecodeState& st, int64_t t, int64_t s, bool commit = true) const {
    return pathattn::decode(rows(q, t, s), rows(k, t, s), rows(v, t, s), rows(w, t, s), rows(beta, t, s), st,
                            rows(g, t, s), std::nullopt, commit);
  }
};

TEST(DecodeState, PrefillThenStepsEqualTheWholeForward) {
  torch::manual_seed(31);
  const int64_t B = 2, T0 = 65, H = 2, HQ = 4, D = 16, DV = 8, T = T0 + 9;
  const Sequences x(B, T, T0, H, HQ, D, DV);
  const Tensor full = pathattn::path_attention(x.q, x.k, x.v, x.w, x.beta, x.g);
  pathattn::DecodeState state = x.state(T);
  int64_t t = T0;
  for (int64_t s : {1, 7, 1}) {
    const pathattn::DecodeOutput out = x.decode(state, t, s);
    // Two f32 computations of the same sequence (the decode step carries the cache, the forward carries
    // chunks): rounding only, far under kF32VsF64 relative to the largest output.
    const Tensor ref = Sequences::rows(full, t, s);
    const double err = (out.o - ref).abs().max().item<double>() / ref.abs().max().item<double>();
    EXPECT_LE(err, pathattn::test::tol::kF32VsF64) << "step at t = " << t;
    t += s;
  }
  EXPECT_EQ(state.lengths.sum().item<int64_t>(), B * T);
}

// commit = false through the libtorch entry point: the outputs of the committing call, the state untouched.
TEST(DecodeState, WithoutCommitTheStateIsUntouched) {
  torch::manual_seed(33);
  const int64_t B = 2, T0 = 30, S = 5, T = T0 + S;
  const Sequences x(B, T, T0, 2, 4, 16, 8);
  pathattn::DecodeState state = x.state(T);
  const Tensor k0 = state.k.clone(), v0 = state.v.clone(), g0 = state.gcum.clone(), l0 = state.lengths.clone();
  const pathattn::DecodeOutput tried = x.decode(state, T0, S, /*commit=*/false);
  EXPECT_TRUE(torch::equal(state.k, k0) && torch::equal(state.v, v0) && torch::equal(state.gcum, g0));
  EXPECT_TRUE(torch::equal(state.lengths, l0));
  const pathattn::DecodeOutput out = x.decode(state, T0, S);
  EXPECT_TRUE(torch::equal(tried.o, out.o) && torch::equal(tried.lse, out.lse)) << "the CPU: the same code";
  EXPECT_EQ(state.lengths.sum().item<int64_t>(), B * T);
}

// The same on a checkpointed state (period 8: refreshes inside the steps), beside the plain one.
TEST(DecodeState, CheckpointedStateEqualsThePlainOne) {
  torch::manual_seed(32);
  const int64_t B = 2, T0 = 20, H = 2, D = 16, T = 50;
  const Sequences x(B, T, T0, H, 4, D, 8);
  pathattn::DecodeState plain = x.state(T), ck = x.state(T, 8);
  ASSERT_TRUE(ck.ckpt.defined() && ck.period == 8 && (ck.carry.sizes().vec() == std::vector<int64_t>{B, H, D, D}));
  EXPECT_EQ(ck.ckpt.sum().item<int64_t>(), B * T0);
  int64_t t = T0;
  for (int64_t s : {1, 1, 5, 1, 13, 9}) {
    const Tensor o_plain = x.decode(plain, t, s).o, o = x.decode(ck, t, s).o;
    const double err = (o - o_plain).abs().max().item<double>() / o_plain.abs().max().item<double>();
    EXPECT_LE(err, pathattn::test::tol::kF32VsF64) << "step at t = " << t;
    t += s;
  }
  EXPECT_EQ(t, T);
  const Tensor pending = ck.lengths - ck.ckpt;
  EXPECT_TRUE((pending >= 0).all().item<bool>() && (pending < 8).all().item<bool>()) << pending;
  EXPECT_GT(ck.ckpt.min().item<int64_t>(), T0) << "the checkpoint should have moved";
}

TEST(DecodeState, FullCacheIsANamedError) {
  pathattn::DecodeState state = pathattn::DecodeState::empty(1, 2, 1, 1, 8, 8, false);
  Tensor q = torch::randn({1, 3, 1, 8}), w = torch::nn::functional::normalize(
                                             torch::randn({1, 3, 1, 8}), torch::nn::functional::NormalizeFuncOptions().dim(-1));
  try {
    pathattn::decode(q, torch::randn({1, 3, 1, 8}), torch::randn({1, 3, 1, 8}), w, torch::rand({1, 3, 1}), state);
    FAIL() << "did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache.lengths"), std::string::npos) << e.what();
  }
}

// The state is made on kcache's device: a v or g elsewhere is an error naming it, not a silent copy (the meta device
// stands in for a second device on a CPU-only machine).
TEST(DecodeState, FromPrefillRefusesTensorsOnTwoDevices) {
  const Tensor kcache = torch::zeros({1, 3, 1, 8}), meta = torch::zeros({1, 3, 1, 8}, torch::Device(torch::kMeta));
  auto message = [&](const Tensor& v, const Tensor& g) -> std::string {
    try {
      pathattn::DecodeState::from_prefill(kcache, v, g, 4);
    } catch (const c10::Error& e) {
      return e.what();
    }
    return "did not throw";
  };
  EXPECT_NE(message(meta, Tensor()).find("v must be on kcache's device (cpu), got meta"), std::string::npos)
      << message(meta, Tensor());
  const Tensor g_meta = torch::zeros({1, 3, 1}, torch::Device(torch::kMeta));
  EXPECT_NE(message(kcache, g_meta).find("g must be on kcache's device (cpu), got meta"), std::string::npos)
      << message(kcache, g_meta);
  // The state's device follows kcache (CPU here; tests/model/test_model_cuda.cpp and test_decode_cuda.py on CUDA).
  EXPECT_EQ(pathattn::DecodeState::from_prefill(kcache, kcache, Tensor(), 4).lengths.device(), kcache.device());
}

}  // namespace
