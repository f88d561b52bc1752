// The CUDA backward (dq, dk, dv, dw, dbeta, dg) against the f64 oracle with FlashAttention's tolerance rule: each
// case runs the CUDA forward (o, lse as a user gets them), then the backward with a random dO (and dlse in some
// cases) into NaN-poisoned outputs between guard bands. The yardstick is the low-precision recurrence of
// tests/recurrence.h; the oracle is Backend::reference, or for T > kLongT (where the reference's O(T^2 D) memory is
// out of reach) the checkpointed f64 recurrence, which test_recurrence proves equal to it.
// Also: bit-identical repeats with deterministic = true, the rule with deterministic = false, DV != D refused, and
// the CUDA-free bf16 / f16 rounding of the baselines against the CUDA conversions (runs without a GPU).
// Label gpu: run by tools/gpu_check.sh. The T = 16384 case is instantiated as Long/...: --gtest_filter=-Long/* skips it.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "device_buffers.h"
#include "device_inputs.h"
#include "expect_within.h"
#include "harness.h"
#include "lowp_round.h"
#include "recurrence.h"
#include "softmax_attention.h"

namespace pathattn::test {
namespace {

// Longest T for which the oracle is Backend::reference: it keeps every transformed key, T^2 D / 2 doubles per
// (sequence, kv head) (1 GB at T = 2048, D = 128); beyond, the checkpointed recurrence.
constexpr int64_t kLongT = 2048;

// The f64 oracle's outputs and gradients for the loss sum(dO o) (+ sum(dlse lse) when with_dlse).
RecurrenceResult f64_oracle(const Problem64& P, const OutputGrads& og, bool with_dlse) {
  if (P.spec.T > kLongT) return run_recurrence(P, og.dout, with_dlse ? og.dlse : std::vector<double>{});
  Case<double> r(P);  // draws the same dO and dlse (draw_output_grads)
  r.forward(Backend::reference, false);
  if (with_dlse)
    r.backward_with_lse(Backend::reference);
  else
    r.backward(Backend::reference);
  RecurrenceResult x;
  x.o = r.o.to_vector(), x.lse = r.lse.to_vector();
  x.dq = r.dq.to_vector(), x.dk = r.dk.to_vector(), x.dv = r.dv.to_vector(), x.dw = r.dw.to_vector();
  x.dbeta = r.dbeta.to_vector();
  if (P.spec.gate) x.dg = r.dg.to_vector();
  return x;
}

// The gradients of one backward call on the device, poisoned and guarded; each in its input's dtype.
struct DevGrads {
  DevOut dq, dk, dv, dw, dbeta, dg;
  bool gate;
  explicit DevGrads(const GpuSpec& gs)
      : dq({gs.s.B, gs.s.T, gs.s.HQ, gs.s.D}, gs.dt),
        dk({gs.s.B, gs.s.T, gs.s.H, gs.s.D}, gs.dt),
        dv({gs.s.B, gs.s.T, gs.s.H, gs.s.DV}, gs.dt),
        dw({gs.s.B, gs.s.T, gs.s.H, gs.s.D}, gs.w_lowp ? DType::bf16 : DType::f32),
        dbeta({gs.s.B, gs.s.T, gs.s.H}, DType::f32),
        dg({gs.s.B, gs.s.T, gs.s.HQ}, DType::f32),
        gate(gs.s.gate) {}
  Gradients views() const {
    return Gradients{dq.view, dk.view, dv.view, dw.view, dbeta.view, gate ? dg.view : TensorView{}};
  }
  // (name, device tensor, the matching member of a RecurrenceResult), dg only with a gate.
  std::vector<std::tuple<const char*, const DevOut*, std::vector<double> RecurrenceResult::*>> list() const {
    std::vector<std::tuple<const char*, const DevOut*, std::vector<double> RecurrenceResult::*>> l = {
        {"dq", &dq, &RecurrenceResult::dq}, {"dk", &dk, &RecurrenceResult::dk},
        {"dv", &dv, &RecurrenceResult::dv}, {"dw", &dw, &RecurrenceResult::dw},
        {"dbeta", &dbeta, &RecurrenceResult::dbeta}};
    if (gate) l.push_back({"dg", &dg, &RecurrenceResult::dg});
    return l;
  }
};

// One case on the device: its inputs, the CUDA forward's o and lse, and dO (dlse) as the backward gets them.
struct CudaCase {
  GpuSpec gs;
  Problem64 P;
  OutputGrads og;
  DevInputs dev;
  DevOut o, lse;
  DevTensor dout;              // [B, T, HQ, DV] in q's dtype, permuted like the inputs
  std::unique_ptr<DevTensor> dlse;  // [B, T, HQ] f32, when the case has one
  explicit CudaCase(const GpuSpec& g)
      : gs(g),
        P(g.s),
        og(draw_output_grads(g.s)),
        dev(P, g),
        o({g.s.B, g.s.T, g.s.HQ, g.s.DV}, g.dt),
        lse({g.s.B, g.s.T, g.s.HQ}, DType::f32),
        dout(og.dout, {g.s.B, g.s.T, g.s.HQ, g.s.DV}, g.dt, g.s.permuted) {
    if (g.dlse) dlse = std::make_unique<DevTensor>(og.dlse, std::vector<int64_t>{g.s.B, g.s.T, g.s.HQ}, DType::f32,
                                                   g.s.permuted);
  }
  void forward() { pathattn::forward(dev.in, ForwardOutputs{o.view, lse.view, {}}, Backend::cuda); }
  void backward(const DevGrads& g, bool deterministic) {
    Inputs in = dev.in;
    in.deterministic = deterministic;
    pathattn::backward(in, o.view, lse.view, dout.view, dlse ? dlse->view : TensorView{}, g.views(), Backend::cuda);
  }
  // The low-precision baseline of this case (the kernel's input dtypes).
  RecurrenceResult baseline() const {
    return run_recurrence(P, og.dout, gs.dlse ? og.dlse : std::vector<double>{},
                          {.operands = gs.dt, .w_bf16 = gs.w_lowp});
  }
};

// Every gradient written (no NaN poison left), nothing written outside, and each within the rule.
void check_gradients(const DevGrads& g, const RecurrenceResult& ref, const RecurrenceResult& base) {
  for (const auto& [name, dev, m] : g.list()) {
    const std::vector<double> got = dev->to_vector();
    EXPECT_EQ(count_nonfinite(got), 0) << name << " has unwritten (NaN-poisoned) or non-finite elements";
    EXPECT_TRUE(dev->buf.guards_intact()) << "write outside " << name;
    expect_within(name, got, ref.*m, base.*m);
  }
  EXPECT_TRUE(g.dg.buf.guards_intact()) << "write outside dg";  // also when dg is not passed (no gate)
}

// PATHATTN_TEST_BWD_FAST=1 runs the case table's backward in the fast mode (deterministic = false) instead of the
// default deterministic one, so that the fast mode's own kernel instances (the main kernels' unordered additions)
// meet every case, not only the determinism test's one; the same rule.
bool test_fast_mode() {
  const char* e = std::getenv("PATHATTN_TEST_BWD_FAST");
  return e && std::string(e) == "1";
}

class CudaBackward : public ::testing::TestWithParam<GpuSpec> {};

TEST_P(CudaBackward, MatchesReference) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  CudaCase c(GetParam());
  const Spec& s = c.gs.s;
  const RecurrenceResult ref = f64_oracle(c.P, c.og, c.gs.dlse), base = c.baseline();

  ASSERT_NO_THROW(c.forward());
  DevGrads g(c.gs);
  ASSERT_NO_THROW(c.backward(g, !test_fast_mode()));
  TEST_CUDA(cudaDeviceSynchronize());
  std::printf("%s%s\n", c.gs.name().c_str(), test_fast_mode() ? ", deterministic = false" : "");
  check_gradients(g, ref, base);

  if (s.beta == BetaDist::exact0) {
    // Every H_t = I: PaTH is plain softmax attention, whose gradients (code without any Householder step) the
    // kernel must give too, and dw = -beta (...) = 0 (the baseline's dw is exactly 0: the bound is kLowPrecisionAbs).
    std::printf(" against plain softmax attention:\n");
    const SoftmaxAttention a = softmax_attention(c.P, c.og.dout, c.gs.dlse ? c.og.dlse : std::vector<double>{});
    expect_within("dq", g.dq.to_vector(), a.dq, base.dq);
    expect_within("dk", g.dk.to_vector(), a.dk, base.dk);
    expect_within("dv", g.dv.to_vector(), a.dv, base.dv);
    expect_within("dw", g.dw.to_vector(), std::vector<double>(base.dw.size(), 0.0), base.dw);
    if (s.gate) expect_within("dg", g.dg.to_vector(), a.dg, base.dg);
  }
}

std::vector<GpuSpec> cases() {
  std::vector<GpuSpec> c = core_cases();
  // GQA 8:1: eight query heads add into one dk, dv, dw, dbeta.
  c.push_back({{.B = 1, .T = 200, .H = 1, .HQ = 8, .D = 64, .DV = 64, .gate = true, .seed = 16}, DType::bf16});
  c.push_back({{.B = 2, .T = 130, .H = 1, .HQ = 8, .D = 128, .DV = 128, .seed = 17}, DType::f16});
  // The attention of tests/model/test_model_cuda.cpp's GradientsEqualTheF64Model at A5's length: four sequences
  // of one partial chunk (T = 10), GQA 2:1, D = 64, with and without the gate (PaTH-FoX, PaTH).
  for (bool gate : {false, true})
    c.push_back({{.B = 4, .T = 10, .H = 2, .HQ = 4, .D = 64, .DV = 64, .gate = gate, .seed = 35}, DType::bf16});
  // beta near 0, near 1 (singular H_t), near 2, in [1.9, 2], exactly 0 (plain softmax attention), exactly 2.
  for (BetaDist bd : {BetaDist::near0, BetaDist::near1, BetaDist::near2, BetaDist::high, BetaDist::exact0,
                      BetaDist::exact2})
    for (bool gate : {false, true})
      c.push_back({{.B = 1, .T = 200, .H = 2, .HQ = 4, .D = 64, .DV = 64, .gate = gate, .beta = bd, .seed = 7},
                   DType::bf16});
  c.push_back({{.B = 1, .T = 200, .H = 1, .HQ = 4, .D = 128, .DV = 128, .gate = true, .beta = BetaDist::high,
                .seed = 8}, DType::f16});
  c.push_back({{.B = 2, .T = 65, .H = 1, .HQ = 2, .D = 128, .DV = 128, .beta = BetaDist::exact2, .seed = 18},
               DType::f16});
  c.push_back({{.B = 1, .T = 331, .H = 1, .HQ = 4, .D = 64, .DV = 64, .gate = true,
                .seqlens = {1, 63, 1, 130, 64, 65, 7}, .beta = BetaDist::exact0, .seed = 19}, DType::bf16});
  // Long, gated, GQA: many chunks carry the gradients back.
  c.push_back({{.B = 1, .T = 1000, .H = 1, .HQ = 4, .D = 128, .DV = 128, .gate = true, .seed = 9}, DType::f16});
  c.push_back({{.B = 1, .T = 1000, .H = 1, .HQ = 4, .D = 64, .DV = 64, .gate = true, .seed = 10}, DType::bf16});
  // Non-contiguous views ([B, H, T, D] storage, dO and dlse too), w in bf16 (with bf16 and with f16 q), w rows
  // with a stride of D + 1.
  c.push_back({{.B = 2, .T = 130, .H = 2, .HQ = 4, .D = 64, .DV = 64, .gate = true, .permuted = true, .seed = 12},
               DType::bf16, true});
  c.push_back({{.B = 1, .T = 97, .H = 2, .HQ = 2, .D = 128, .DV = 128, .permuted = true, .seed = 13}, DType::f16});
  c.push_back({{.B = 1, .T = 97, .H = 2, .HQ = 4, .D = 128, .DV = 128, .gate = true, .seed = 15}, DType::f16, true});
  c.push_back({{.B = 2, .T = 130, .H = 2, .HQ = 2, .D = 64, .DV = 64, .seed = 14}, DType::bf16, false, true});
  // dlse given: with one key per sequence it is all of dl (dO . v - dO . o = 0); varlen; everything at once.
  c.push_back({{.B = 1, .T = 200, .H = 1, .HQ = 4, .D = 64, .DV = 64, .gate = true, .seed = 20}, DType::bf16, false,
               false, true});
  c.push_back({{.B = 2, .T = 1, .H = 2, .HQ = 2, .D = 128, .DV = 128, .seed = 21}, DType::f16, false, false, true});
  c.push_back({{.B = 1, .T = 331, .H = 2, .HQ = 4, .D = 128, .DV = 128, .seqlens = {1, 63, 1, 130, 64, 65, 7},
                .seed = 22}, DType::f16, false, false, true});
  c.push_back({{.B = 1, .T = 1000, .H = 2, .HQ = 4, .D = 64, .DV = 64, .gate = true, .permuted = true, .seed = 23},
               DType::bf16, true, false, true});
  return c;
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaBackward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// T = 16384 (the long case): gated, GQA 2:1, against the checkpointed f64 recurrence. Minutes of CPU for
// the oracle and the baseline (O(T^2 D) each); its own instantiation so that --gtest_filter=-Long/* leaves it out.
INSTANTIATE_TEST_SUITE_P(Long, CudaBackward,
                         ::testing::Values(GpuSpec{{.B = 1, .T = 16384, .H = 1, .HQ = 2, .D = 64, .DV = 64,
                                                    .gate = true, .seed = 24}, DType::bf16}),
                         [](const auto& info) { return info.param.name(); });

// deterministic = true: two calls on the same inputs give the same bits in every gradient (many chunks, GQA 4:1,
// the gate, B > 1, so that cross-block sums exist everywhere), at D = 64 and 128 (each D's main kernel orders its
// sums its own way). deterministic = false: not bitwise, but the same rule.
TEST(CudaBackwardDeterminism, BitwiseRepeatable) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  for (const GpuSpec& gs : {GpuSpec{{.B = 2, .T = 1000, .H = 2, .HQ = 8, .D = 64, .DV = 64, .gate = true, .seed = 25}, DType::bf16},
                            GpuSpec{{.B = 2, .T = 1000, .H = 2, .HQ = 8, .D = 128, .DV = 128, .gate = true, .seed = 34}, DType::bf16}}) {
    CudaCase c(gs);
    ASSERT_NO_THROW(c.forward());
    DevGrads a(c.gs), b(c.gs), nd(c.gs);
    ASSERT_NO_THROW(c.backward(a, true));
    ASSERT_NO_THROW(c.backward(b, true));
    ASSERT_NO_THROW(c.backward(nd, false));
    TEST_CUDA(cudaDeviceSynchronize());
    const auto la = a.list(), lb = b.list();
    for (size_t i = 0; i < la.size(); ++i)
      EXPECT_TRUE(std::get<1>(la[i])->buf.download<uint8_t>() == std::get<1>(lb[i])->buf.download<uint8_t>())
          << gs.name() << ": " << std::get<0>(la[i]) << " differs between two deterministic calls";
    std::printf("%s, deterministic = false\n", c.gs.name().c_str());
    check_gradients(nd, f64_oracle(c.P, c.og, false), c.baseline());
  }
}

// dout's rows 4-byte but not 16-byte aligned (each row padded by 2 elements: the API asks 4-byte rows of dout, not 16;
// a kernel that copied its rows in 16-byte pieces, as v26 did, docs/perf/notes.md, must not take them so): the
// gradients have the bits of the same call with contiguous dout, and they meet the rule.
TEST(CudaBackwardLayouts, DoutRowsNot16ByteAlignedSameBits) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  CudaCase c(GpuSpec{{.B = 2, .T = 200, .H = 2, .HQ = 4, .D = 64, .DV = 64, .gate = true, .seed = 35}, DType::bf16});
  const Spec& s = c.gs.s;
  DevTensor padded(c.og.dout, {s.B, s.T, s.HQ, s.DV}, c.gs.dt, false, /*pad=*/2);
  ASSERT_EQ(padded.view.strides[2], s.DV + 2);
  ASSERT_NO_THROW(c.forward());
  DevGrads a(c.gs), b(c.gs);
  ASSERT_NO_THROW(c.backward(a, true));
  Inputs in = c.dev.in;
  in.deterministic = true;
  ASSERT_NO_THROW(pathattn::backward(in, c.o.view, c.lse.view, padded.view, b.views(), Backend::cuda));
  TEST_CUDA(cudaDeviceSynchronize());
  const auto la = a.list(), lb = b.list();
  for (size_t i = 0; i < la.size(); ++i)
    EXPECT_TRUE(std::get<1>(la[i])->buf.download<uint8_t>() == std::get<1>(lb[i])->buf.download<uint8_t>())
        << std::get<0>(la[i]) << " differs with dout's rows padded to 66 elements";
  check_gradients(b, f64_oracle(c.P, c.og, false), c.baseline());
}

// Inputs::cuda_workspace_limit: a limit below one call's scratch runs the call over groups of kv heads in turn
// (common/head_slices.h). The heads are independent, so forward and (deterministic) backward give the same bits as
// one call over all heads; a limit of 1 byte forces one kv head at a time. GQA 2:1, gate, B > 1.
TEST(CudaWorkspaceLimit, HeadSlicesSameBits) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  CudaCase c(GpuSpec{{.B = 2, .T = 300, .H = 4, .HQ = 8, .D = 64, .DV = 64, .gate = true, .seed = 27}, DType::bf16});
  const Spec& s = c.gs.s;
  Inputs whole = c.dev.in, sliced = c.dev.in;
  whole.cuda_workspace_limit = 0;
  sliced.cuda_workspace_limit = 1;
  DevOut o1({s.B, s.T, s.HQ, s.DV}, c.gs.dt), lse1({s.B, s.T, s.HQ}, DType::f32);
  DevOut o2({s.B, s.T, s.HQ, s.DV}, c.gs.dt), lse2({s.B, s.T, s.HQ}, DType::f32);
  ASSERT_NO_THROW(pathattn::forward(whole, ForwardOutputs{o1.view, lse1.view, {}}, Backend::cuda));
  ASSERT_NO_THROW(pathattn::forward(sliced, ForwardOutputs{o2.view, lse2.view, {}}, Backend::cuda));
  DevGrads a(c.gs), b(c.gs);
  ASSERT_NO_THROW(pathattn::backward(whole, o1.view, lse1.view, c.dout.view, a.views(), Backend::cuda));
  ASSERT_NO_THROW(pathattn::backward(sliced, o1.view, lse1.view, c.dout.view, b.views(), Backend::cuda));
  TEST_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(o1.buf.download<uint8_t>() == o2.buf.download<uint8_t>()) << "o differs with one kv head per call";
  EXPECT_TRUE(lse1.buf.download<uint8_t>() == lse2.buf.download<uint8_t>()) << "lse differs with one kv head per call";
  const auto la = a.list(), lb = b.list();
  for (size_t i = 0; i < la.size(); ++i) {
    EXPECT_TRUE(std::get<1>(la[i])->buf.download<uint8_t>() == std::get<1>(lb[i])->buf.download<uint8_t>())
        << std::get<0>(la[i]) << " differs with one kv head per call";
    EXPECT_TRUE(std::get<1>(lb[i])->buf.guards_intact()) << "write outside " << std::get<0>(lb[i]);
  }
  // And the sliced gradients are right, not only the same.
  check_gradients(b, f64_oracle(c.P, c.og, false), c.baseline());
}

// The backward refuses DV != D as the forward does, with the reason in the message (CudaSupport: the name the
// forward's support test has, so that one sanitizer filter selects both).
TEST(CudaSupport, BackwardRefusesDvNotD) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const GpuSpec gs{{.B = 1, .T = 8, .H = 1, .HQ = 1, .D = 64, .DV = 32, .seed = 26}, DType::bf16};
  const Spec& s = gs.s;
  Problem64 P(s);
  DevInputs dev(P, gs);
  const Support sup = pathattn::supports(dev.in, Backend::cuda, /*backward=*/true);
  EXPECT_FALSE(sup.ok);
  EXPECT_NE(sup.reason.find("DV == D"), std::string::npos) << sup.reason;
  const OutputGrads og = draw_output_grads(s);
  DevTensor o(std::vector<double>(s.B * s.T * s.HQ * s.DV, 0.5), {s.B, s.T, s.HQ, s.DV}, gs.dt, false);
  DevTensor lse(std::vector<double>(s.B * s.T * s.HQ, 1.0), {s.B, s.T, s.HQ}, DType::f32, false);
  DevTensor dout(og.dout, {s.B, s.T, s.HQ, s.DV}, gs.dt, false);
  DevGrads g(gs);
  try {
    pathattn::backward(dev.in, o.view, lse.view, dout.view, g.views(), Backend::cuda);
    ADD_FAILURE() << "backward accepted DV != D";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DV == D"), std::string::npos) << e.what();
  }
}

// The baselines round with tests/lowp_round.h (no CUDA headers, so that the CPU tests can build them); it must be
// the CUDA conversions bit for bit: specials, both sides of f16's subnormal and overflow edges, exact ties, random
// bit patterns. Host code only: runs without a GPU.
TEST(LowpRound, MatchesCudaConversions) {
  std::vector<float> xs = {0.f, -0.f, INFINITY, -INFINITY, 65504.f, 65519.f, 65520.f, 65536.f, -65520.f, 0x1p-14f,
                           0x1p-24f, 0x1p-25f, 0x3p-25f, 0x1.ffcp-15f, 0x1.ffep-15f, 3.4e38f, -3.4e38f, 0x1p-149f,
                           0x1.fefp127f, 1.f, -1.f, 1.00390625f, 1.005859375f};
  for (int k = 0; k < (1 << 14); ++k) xs.push_back(std::ldexp(float(k), -26));  // f16 subnormals and their ties
  std::mt19937 rng(27);
  for (int n = 0; n < (1 << 21); ++n) {
    const uint32_t u = rng();
    for (uint32_t bits : {u, (u & ~0xFFFFu) | 0x8000u, (u & ~0x1FFFu) | 0x1000u}) {  // any, a bf16 tie, an f16 tie
      float f;
      std::memcpy(&f, &bits, 4);
      xs.push_back(f);
    }
  }
  int64_t bad_bf16 = 0, bad_f16 = 0;
  auto same = [](float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
  };
  for (float x : xs) {
    const float want_b = __bfloat162float(__float2bfloat16_rn(x)), want_h = __half2float(__float2half_rn(x));
    if (!same(round_bf16(x), want_b) && bad_bf16++ < 5) ADD_FAILURE() << "bf16 of " << x << ": " << round_bf16(x) << " vs " << want_b;
    if (!same(round_f16(x), want_h) && bad_f16++ < 5) ADD_FAILURE() << "f16 of " << x << ": " << round_f16(x) << " vs " << want_h;
  }
  EXPECT_EQ(bad_bf16 + bad_f16, 0) << "of " << xs.size() << " values";
}

}  // namespace
}  // namespace pathattn::test
