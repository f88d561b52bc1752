// The CUDA forward (o, lse, kcache) against the f64 reference across the core case list, with FlashAttention's
// tolerance rule (lowp_baseline.h). Outputs are poisoned with NaN before each run and lie between guard bands,
// so an element left unwritten or a stray write fails the test. Label gpu: run by tools/gpu_check.sh.
#include <cuda_runtime.h>

#include <limits>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "device_inputs.h"
#include "expect_within.h"
#include "harness.h"
#include "lowp_baseline.h"

namespace pathattn::test {
namespace {

class CudaForward : public ::testing::TestWithParam<GpuSpec> {};

TEST_P(CudaForward, MatchesReference) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const GpuSpec gs = GetParam();
  const Spec& s = gs.s;
  Problem64 P(s);

  // f64 reference (o, lse, kcache) and the low-precision baseline.
  Case<double> r(P);
  r.forward(Backend::reference, true);
  const LowpResult base = lowp_forward(P, gs.dt, gs.w_lowp);

  DevInputs dev(P, gs);
  const Inputs& in = dev.in;
  const std::vector<double> ref_o = r.o.to_vector(), ref_lse = r.lse.to_vector(), ref_kc = r.kcache.to_vector();
  std::printf("%s\n", gs.name().c_str());
  // Without the key cache (the training forward: TF32 preprocess), then with it (all-f32 preprocess + suffix
  // products): both paths must meet the rule on o and lse.
  for (bool with_kcache : {false, true}) {
    DevOut o({s.B, s.T, s.HQ, s.DV}, gs.dt), lse({s.B, s.T, s.HQ}, DType::f32), kc({s.B, s.T, s.H, s.D}, gs.dt);
    ForwardOutputs out{o.view, lse.view, with_kcache ? kc.view : TensorView{}};
    ASSERT_NO_THROW(pathattn::forward(in, out, Backend::cuda));
    TEST_CUDA(cudaDeviceSynchronize());
    const std::vector<double> go = o.to_vector(), glse = lse.to_vector();
    EXPECT_EQ(count_nonfinite(go), 0) << "o has unwritten (NaN-poisoned) or non-finite elements";
    EXPECT_EQ(count_nonfinite(glse), 0) << "lse has unwritten or non-finite elements";
    EXPECT_TRUE(o.buf.guards_intact() && lse.buf.guards_intact() && kc.buf.guards_intact()) << "write outside an output";
    std::printf(" %s\n", with_kcache ? "with kcache (f32 preprocess)" : "without kcache (TF32 preprocess)");
    expect_within("o", go, ref_o, base.o);
    expect_within("lse", glse, ref_lse, base.lse);
    if (with_kcache) {
      const std::vector<double> gkc = kc.to_vector();
      EXPECT_EQ(count_nonfinite(gkc), 0) << "kcache has unwritten or non-finite elements";
      expect_within("kcache", gkc, ref_kc, base.kcache);
    }
  }
}

std::vector<GpuSpec> cases() {
  std::vector<GpuSpec> c = core_cases();
  // beta near 0, 1 (singular H_t), 2 (reflection-like), with and without gate, GQA.
  for (BetaDist bd : {BetaDist::near0, BetaDist::near1, BetaDist::near2})
    for (bool gate : {false, true})
      c.push_back({{.B = 1, .T = 200, .H = 2, .HQ = 4, .D = 64, .DV = 64, .gate = gate, .beta = bd, .seed = 7}, DType::bf16});
  c.push_back({{.B = 1, .T = 200, .H = 1, .HQ = 4, .D = 128, .DV = 128, .gate = true, .beta = BetaDist::near2, .seed = 8},
               DType::f16});
  // Long, gated, GQA: many chunks carry the query and the gate offsets.
  c.push_back({{.B = 1, .T = 1000, .H = 1, .HQ = 4, .D = 128, .DV = 128, .gate = true, .seed = 9}, DType::f16});
  c.push_back({{.B = 1, .T = 1000, .H = 1, .HQ = 4, .D = 64, .DV = 64, .gate = true, .seed = 10}, DType::bf16});
  // Non-contiguous views ([B, H, T, D] storage) and w given in bf16.
  c.push_back({{.B = 2, .T = 130, .H = 2, .HQ = 4, .D = 64, .DV = 64, .gate = true, .permuted = true, .seed = 12}, DType::bf16, true});
  c.push_back({{.B = 1, .T = 97, .H = 2, .HQ = 2, .D = 128, .DV = 128, .permuted = true, .seed = 13}, DType::f16});
  // w with row strides of D + 1 (f32 and bf16): the preprocess's scalar load path.
  c.push_back({{.B = 2, .T = 130, .H = 2, .HQ = 2, .D = 64, .DV = 64, .seed = 14}, DType::bf16, false, true});
  c.push_back({{.B = 1, .T = 97, .H = 2, .HQ = 4, .D = 128, .DV = 128, .gate = true, .seed = 15}, DType::f16, true, true});
  return c;
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaForward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// Unsupported cases throw pathattn::Error with the reason; a supported case is supported by the backward too.
TEST(CudaSupport, ClearReasons) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  auto make = [](int64_t D, int64_t DV) {
    Spec s{.B = 1, .T = 8, .H = 1, .HQ = 1, .D = D, .DV = DV};
    return s;
  };
  for (auto [D, DV, expect] : {std::tuple{32, 32, "D = 64 or 128"}, {64, 32, "DV == D"}}) {
    Problem64 P(make(D, DV));
    DevTensor q(P.q, {1, 8, 1, D}, DType::bf16, false), k(P.k, {1, 8, 1, D}, DType::bf16, false),
        v(P.v, {1, 8, 1, DV}, DType::bf16, false), w(P.w, {1, 8, 1, D}, DType::f32, false),
        beta(P.beta, {1, 8, 1}, DType::f32, false);
    Inputs in{q.view, k.view, v.view, w.view, beta.view, {}, {}, {}};
    const Support sup = pathattn::supports(in, Backend::cuda);
    EXPECT_FALSE(sup.ok);
    EXPECT_NE(sup.reason.find(expect), std::string::npos) << sup.reason;
    DevOut o({1, 8, 1, DV}, DType::bf16), lse({1, 8, 1}, DType::f32);
    try {
      pathattn::forward(in, ForwardOutputs{o.view, lse.view, {}}, Backend::cuda);
      ADD_FAILURE() << "forward accepted an unsupported case";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  }
  Problem64 P(make(64, 64));
  DevTensor q(P.q, {1, 8, 1, 64}, DType::bf16, false), k(P.k, {1, 8, 1, 64}, DType::bf16, false),
      v(P.v, {1, 8, 1, 64}, DType::bf16, false), w(P.w, {1, 8, 1, 64}, DType::f32, false),
      beta(P.beta, {1, 8, 1}, DType::f32, false);
  Inputs in{q.view, k.view, v.view, w.view, beta.view, {}, {}, {}};
  const Support sup = pathattn::supports(in, Backend::cuda, /*backward=*/true);
  EXPECT_TRUE(sup.ok) << sup.reason;
}

// Inputs::check_values: beta out of [0, 2] or NaN, and g > 0, are named with their index as on the CPU (docs/api.md);
// without the option the call runs (the check is off by default on CUDA). Permuted views: the check follows strides.
TEST(CudaValueCheck, NamesTheFirstBadElement) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 2, T = 70, H = 2, HQ = 4, D = 64;
  Spec s{.B = B, .T = T, .H = H, .HQ = HQ, .D = D, .DV = D, .gate = true, .seed = 21};
  struct Bad {
    bool in_beta;
    int64_t b, t, h;
    double value;
    const char* expect;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Bad& bad : {Bad{true, 1, 65, 1, 2.5, "beta must be in [0, 2] (not NaN), got 2.5 at [1, 65, 1]"},
                         Bad{true, 0, 3, 0, -0.25, "beta must be in [0, 2] (not NaN), got -0.25 at [0, 3, 0]"},
                         Bad{true, 1, 0, 1, nan, "beta must be in [0, 2] (not NaN), got nan at [1, 0, 1]"},
                         Bad{false, 1, 69, 3, 0.5, "g must be a finite log forget gate <= 0"}}) {
    Problem64 P(s);
    if (bad.in_beta) {
      P.beta[(bad.b * T + bad.t) * H + bad.h] = bad.value;
      P.beta.back() = 3.0;  // a later bad element: the first one is named
    } else {
      P.g[(bad.b * T + bad.t) * HQ + bad.h] = bad.value;
    }
    for (bool permuted : {false, true}) {
      DevTensor q(P.q, {B, T, HQ, D}, DType::bf16, permuted), k(P.k, {B, T, H, D}, DType::bf16, permuted),
          v(P.v, {B, T, H, D}, DType::bf16, permuted), w(P.w, {B, T, H, D}, DType::f32, permuted),
          beta(P.beta, {B, T, H}, DType::f32, permuted), g(P.g, {B, T, HQ}, DType::f32, permuted);
      Inputs in{q.view, k.view, v.view, w.view, beta.view, g.view, {}, {}};
      DevOut o({B, T, HQ, D}, DType::bf16), lse({B, T, HQ}, DType::f32);
      const ForwardOutputs out{o.view, lse.view, {}};
      EXPECT_NO_THROW(pathattn::forward(in, out, Backend::cuda)) << "the check must be off by default";
      TEST_CUDA(cudaDeviceSynchronize());
      in.check_values = true;
      try {
        pathattn::forward(in, out, Backend::cuda);
        ADD_FAILURE() << "forward accepted " << bad.expect;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(bad.expect), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace pathattn::test
