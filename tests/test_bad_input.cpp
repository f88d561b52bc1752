// Bad input at the API boundary: every invalid argument throws pathattn::Error whose message names the argument
// and says what was expected; unsupported cases are answered by supports() with a reason, without throwing.
// Views that claim Device::cuda carry a pointer that would crash if dereferenced: the checks must fire first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#if __has_include(<gmock/gmock.h>)
#include <gmock/gmock.h>
#define PATHATTN_HAVE_GMOCK 1
#endif

#include "harness.h"

namespace pathattn::test {
namespace {

#ifdef PATHATTN_HAVE_GMOCK
using ::testing::AllOf;
using ::testing::HasSubstr;
#else
// The GPU image builds googletest without gmock (tools/gpu_check.sh): the two matchers used here, for strings.
struct Substrings {
  std::vector<std::string> parts;
};
Substrings HasSubstr(std::string s) { return {{std::move(s)}}; }
template <typename... M>
Substrings AllOf(const M&... ms) {
  Substrings all;
  (all.parts.insert(all.parts.end(), ms.parts.begin(), ms.parts.end()), ...);
  return all;
}
::testing::AssertionResult ContainsAll(const char* expr, const char*, const std::string& s, const Substrings& m) {
  for (const std::string& p : m.parts)
    if (s.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << expr << " = \"" << s << "\" has no substring \"" << p << "\"";
  return ::testing::AssertionSuccess();
}
#define EXPECT_THAT(s, m) EXPECT_PRED_FORMAT2(ContainsAll, s, m)
#endif

// Runs f, which must throw pathattn::Error (not another exception type); returns the message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw an exception that is not pathattn::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// An address that faults when read: views on a "device" the test pretends to have point here.
void* unreadable() { return reinterpret_cast<void*>(static_cast<uintptr_t>(16)); }

// A valid problem (GQA, gate, DV != D) whose inputs each test breaks in one way.
// Sizes: B = 1, T = 8, H = 2, HQ = 4, D = 16, DV = 8.
struct BadInput : ::testing::Test {
  Problem64 P{Spec{.B = 1, .T = 8, .H = 2, .HQ = 4, .D = 16, .DV = 8, .gate = true, .seed = 5}};
  Case<float> c{P};

  std::string fwd() { return error_of([&] { c.forward(Backend::automatic); }); }
  std::string bwd() { return error_of([&] { c.backward(Backend::automatic); }); }
  // Sanity: the unbroken problem runs (so that each test's error comes from its one change).
  void SetUp() override {
    Case<float> ok(P);
    ok.forward(Backend::automatic);
    ok.backward(Backend::automatic);
  }
};

TEST_F(BadInput, WrongRankOfQ) {
  c.in.q.ndim = 3;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("q must have 4 dimensions [B, T, HQ, D]"), HasSubstr("got 3")));
}

TEST_F(BadInput, NegativeOrZeroSizesOfQ) {
  for (TensorView* t : {&c.in.q, &c.in.k, &c.in.v, &c.in.w, &c.in.beta, &c.in.g}) t->sizes[1] = -3;  // T = -3
  EXPECT_THAT(fwd(), AllOf(HasSubstr("q must have sizes B >= 0, T >= 0, HQ >= 1"), HasSubstr("got [1, -3, 4, 16]")));
  Case<float> d(P);
  d.in.q.sizes[2] = 0;  // no query heads
  d.in.g = TensorView{};
  EXPECT_THAT(error_of([&] { check_inputs(d.in); }), AllOf(HasSubstr("HQ >= 1"), HasSubstr("got [1, 8, 0, 16]")));
}

TEST_F(BadInput, WrongRankOfK) {
  c.in.k.ndim = 3;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("k must have 4 dimensions [B, T, H, D]"), HasSubstr("got 3")));
}

TEST_F(BadInput, WrongRankOfV) {
  c.in.v.ndim = 2;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("v must have 4 dimensions [B, T, H, DV]"), HasSubstr("got 2")));
}

TEST_F(BadInput, WrongRankOfBeta) {
  c.in.beta.ndim = 4;
  c.in.beta.sizes[3] = 1;
  EXPECT_THAT(fwd(), HasSubstr("beta must have 3 dimensions [B, T, H]"));
}

TEST_F(BadInput, WrongRankOfCuSeqlens) {
  c.cu.data()[0] = 0;
  c.in.cu_seqlens = c.cu.view;
  c.in.cu_seqlens.ndim = 2;  // [1, 1]
  c.in.cu_seqlens.sizes[1] = 1;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("cu_seqlens must be a 1-D tensor [N + 1]"), HasSubstr("[1, 1]")));
}

TEST_F(BadInput, WrongShapeOfK) {
  c.in.k.sizes[3] = 15;  // D of k differs from q's
  EXPECT_THAT(fwd(), AllOf(HasSubstr("k must have shape [B, T, H, D] = [1, 8, 2, 16]"), HasSubstr("got [1, 8, 2, 15]")));
}

TEST_F(BadInput, WrongShapeOfV) {
  c.in.v.sizes[1] = 7;  // T of v differs
  EXPECT_THAT(fwd(), AllOf(HasSubstr("v must have shape [B, T, H, DV] = [1, 8, 2, 8]"), HasSubstr("got [1, 7, 2, 8]")));
}

TEST_F(BadInput, WrongShapeOfW) {
  c.in.w.sizes[2] = 1;  // H of w differs from k's
  EXPECT_THAT(fwd(), AllOf(HasSubstr("w must have shape [B, T, H, D] = [1, 8, 2, 16]"), HasSubstr("got [1, 8, 1, 16]")));
}

TEST_F(BadInput, WrongShapeOfBeta) {
  c.in.beta.sizes[2] = 4;  // per query head instead of per kv head
  EXPECT_THAT(fwd(), AllOf(HasSubstr("beta must have shape [B, T, H] = [1, 8, 2]"), HasSubstr("got [1, 8, 4]")));
}

TEST_F(BadInput, WrongShapeOfG) {
  c.in.g.sizes[2] = 2;  // per kv head instead of per query head
  EXPECT_THAT(fwd(), AllOf(HasSubstr("g must have shape [B, T, HQ] = [1, 8, 4]"), HasSubstr("got [1, 8, 2]")));
}

TEST(BadInputHeads, HqNotAMultipleOfH) {
  Problem64 P(Spec{.B = 1, .T = 4, .H = 2, .HQ = 3, .D = 8, .DV = 8});
  Case<float> c(P);
  EXPECT_THAT(error_of([&] { c.forward(Backend::automatic); }),
              AllOf(HasSubstr("HQ = 3"), HasSubstr("q.size(2)"), HasSubstr("must be a multiple of"),
                    HasSubstr("H = 2"), HasSubstr("k.size(2)")));
}

TEST_F(BadInput, KInFloat64WithQInFloat32) {
  Buffer<double> k64({1, 8, 2, 16}, DType::f64);
  k64.fill_from(P.k);
  c.in.k = k64.view;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("k must have the dtype of q (float32)"), HasSubstr("got float64")));
}

TEST_F(BadInput, GInFloat64WithQInFloat32) {
  Buffer<double> g64({1, 8, 4}, DType::f64);
  g64.fill_from(P.g);
  c.in.g = g64.view;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("g must have the dtype of q (float32)"), HasSubstr("got float64")));
}

TEST_F(BadInput, HalfPrecisionOnTheCpu) {
  for (TensorView* t : {&c.in.q, &c.in.k, &c.in.v}) t->dtype = DType::f16;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("q must have dtype float32 or float64"), HasSubstr("got float16")));
}

TEST_F(BadInput, CuSeqlensNotInt32) {
  Buffer<float> cu({2}, DType::f32);
  cu.data()[0] = 0;
  cu.data()[1] = 8;
  c.in.cu_seqlens = cu.view;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("cu_seqlens must have dtype int32"), HasSubstr("got float32")));
}

// k claims to live on a GPU: the device check must fire before anything reads it.
TEST_F(BadInput, KOnAnotherDevice) {
  c.in.k.device = Device::cuda;
  c.in.k.data = unreadable();
  EXPECT_THAT(fwd(), AllOf(HasSubstr("k must be on the same device as q (cpu:0)"), HasSubstr("got cuda:0")));
}

// beta and cu_seqlens are the tensors whose values are checked on the CPU: a device mismatch must stop that read.
TEST_F(BadInput, BetaOnAnotherDevice) {
  c.in.beta.device = Device::cuda;
  c.in.beta.data = unreadable();
  EXPECT_THAT(fwd(), AllOf(HasSubstr("beta must be on the same device as q (cpu:0)"), HasSubstr("got cuda:0")));
}

TEST_F(BadInput, GOnAnotherDevice) {
  c.in.g.device = Device::cuda;
  c.in.g.data = unreadable();
  EXPECT_THAT(fwd(), AllOf(HasSubstr("g must be on the same device as q (cpu:0)"), HasSubstr("got cuda:0")));
}

TEST_F(BadInput, CuSeqlensOnAnotherDevice) {
  c.in.cu_seqlens = make_view(unreadable(), DType::i32, {2}, Device::cuda);
  EXPECT_THAT(fwd(), AllOf(HasSubstr("cu_seqlens must be on the same device as q (cpu:0)"), HasSubstr("got cuda:0")));
}

// Every input on the "GPU" (bf16, as CUDA takes them), one on another GPU index.
TEST_F(BadInput, VOnAnotherGpu) {
  Inputs in = c.in;
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.w, &in.beta, &in.g}) {
    t->device = Device::cuda;
    t->data = unreadable();
  }
  for (TensorView* t : {&in.q, &in.k, &in.v}) t->dtype = DType::bf16;
  in.v.device_index = 1;
  EXPECT_THAT(error_of([&] { check_inputs(in); }),
              AllOf(HasSubstr("v must be on the same device as q (cuda:0)"), HasSubstr("got cuda:1")));
}

TEST_F(BadInput, OutputOnAnotherDevice) {
  ForwardOutputs out = c.fwd_outputs(false);
  out.o.device = Device::cuda;
  out.o.data = unreadable();
  EXPECT_THAT(error_of([&] { forward(c.in, out); }), HasSubstr("o (output) must be on the device of q"));
}

// Same device type, another index: the output check compares the index too.
TEST_F(BadInput, OutputOnAnotherCpuIndex) {
  ForwardOutputs out = c.fwd_outputs(false);
  out.lse.device_index = 1;
  EXPECT_THAT(error_of([&] { forward(c.in, out); }),
              AllOf(HasSubstr("lse (output) must be on the device of q (cpu:0)"), HasSubstr("got cpu:1")));
}

// In backward, o, lse and dout are read, not written: the message says so.
TEST_F(BadInput, BackwardInputWrongShape) {
  c.forward(Backend::cpu, false);
  TensorView dout = c.dout.view;
  dout.sizes[3] = 3;
  EXPECT_THAT(error_of([&] { backward(c.in, c.o.view, c.lse.view, dout, c.grads()); }),
              AllOf(HasSubstr("dout (backward input) must have shape"), HasSubstr("got [1, 8, 4, 3]")));
}

// Packed varlen batches (B == 1, cu_seqlens [N + 1], T = 8 here).
struct BadCuSeqlens : BadInput {
  Buffer<int32_t> cu{{4}, DType::i32};
  void set(std::initializer_list<int32_t> v) {
    int i = 0;
    for (int32_t x : v) cu.data()[i++] = x;
    c.in.cu_seqlens = cu.view;
  }
  std::string with(std::initializer_list<int32_t> v) {
    set(v);
    return fwd();
  }
};

TEST_F(BadCuSeqlens, Decreasing) {
  EXPECT_THAT(with({0, 5, 3, 8}), AllOf(HasSubstr("cu_seqlens must be non-decreasing"),
                                        HasSubstr("cu_seqlens[2] = 3 < cu_seqlens[1] = 5")));
}

TEST_F(BadCuSeqlens, LastEntryIsNotT) {
  EXPECT_THAT(with({0, 2, 5, 7}), AllOf(HasSubstr("cu_seqlens[-1] must equal the packed length T = 8"),
                                        HasSubstr("got 7")));
}

TEST_F(BadCuSeqlens, FirstEntryIsNotZero) {
  EXPECT_THAT(with({1, 2, 5, 8}), AllOf(HasSubstr("cu_seqlens[0] must be 0"), HasSubstr("got 1")));
}

TEST_F(BadCuSeqlens, ValidOnesPass) {  // empty sequences (equal entries) are allowed
  set({0, 3, 3, 8});
  EXPECT_NO_THROW(c.forward(Backend::automatic));
}

TEST(BadInputVarlen, BatchOfMoreThanOne) {
  Problem64 P(Spec{.B = 2, .T = 8, .H = 1, .HQ = 1, .D = 8, .DV = 8});
  Case<float> c(P);
  Buffer<int32_t> cu({2}, DType::i32);
  cu.data()[0] = 0;
  cu.data()[1] = 8;
  c.in.cu_seqlens = cu.view;
  EXPECT_THAT(error_of([&] { c.forward(Backend::automatic); }),
              AllOf(HasSubstr("cu_seqlens"), HasSubstr("requires B == 1"), HasSubstr("got B = 2")));
}

// Values of beta (in [0, 2]) and g (a log forget gate <= 0), read on the CPU. Index [b, t, h] = [0, 3, 1].
float& beta_at(Case<float>& c) { return c.beta.data()[c.beta.off({0, 3, 1})]; }
float& g_at(Case<float>& c) { return c.g.data()[c.g.off({0, 3, 1})]; }

TEST_F(BadInput, BetaNaN) {
  beta_at(c) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(fwd(), AllOf(HasSubstr("beta must be in [0, 2] (not NaN)"), HasSubstr("nan at [0, 3, 1]")));
  EXPECT_THAT(bwd(), HasSubstr("beta must be in [0, 2]"));  // the backward validates too
}

TEST_F(BadInput, BetaBelowZero) {
  beta_at(c) = -0.01f;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("beta must be in [0, 2]"), HasSubstr("got -0.01 at [0, 3, 1]")));
}

TEST_F(BadInput, BetaAboveTwo) {
  beta_at(c) = 2.01f;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("beta must be in [0, 2]"), HasSubstr("got 2.01 at [0, 3, 1]")));
}

TEST_F(BadInput, BetaAtTheEndsOfItsRangeIsValid) {
  beta_at(c) = 0.0f;
  c.beta.data()[c.beta.off({0, 5, 0})] = 2.0f;
  EXPECT_NO_THROW(c.forward(Backend::automatic));
}

TEST_F(BadInput, GateNaN) {
  g_at(c) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(fwd(), AllOf(HasSubstr("g must be a"), HasSubstr("log forget gate <= 0"), HasSubstr("nan at [0, 3, 1]")));
}

TEST_F(BadInput, GatePositive) {
  g_at(c) = 0.5f;
  EXPECT_THAT(fwd(), AllOf(HasSubstr("g must be a"), HasSubstr("log forget gate <= 0"), HasSubstr("got 0.5 at [0, 3, 1]")));
}

// A gate of -inf makes G_i - G_j = -inf - (-inf) = NaN for every pair after it: rejected, not a NaN output.
TEST_F(BadInput, GateMinusInfinity) {
  g_at(c) = -std::numeric_limits<float>::infinity();
  EXPECT_THAT(fwd(), AllOf(HasSubstr("g must be a finite log forget gate <= 0"), HasSubstr("got -inf at [0, 3, 1]")));
}

TEST_F(BadInput, ScaleNotPositive) {
  c.in.scale = -1.0;
  EXPECT_THAT(fwd(), HasSubstr("scale must be a finite positive number"));
  c.in.scale = std::nan("");
  EXPECT_THAT(fwd(), HasSubstr("scale must be a finite positive number"));
}

TEST_F(BadInput, NullDataPointer) {
  c.in.w.data = nullptr;
  EXPECT_THAT(fwd(), HasSubstr("w has a null data pointer"));
}

// Head dimension 300 exceeds the fast CPU path's maximum; the reference (any D) still runs it.
TEST(BadInputHeadDim, D300OnTheCpuBackend) {
  Problem64 P(Spec{.B = 1, .T = 3, .H = 1, .HQ = 1, .D = 300, .DV = 8});
  Case<float> c(P);
  for (Backend b : {Backend::cpu, Backend::automatic})
    EXPECT_THAT(error_of([&] { c.forward(b); }),
                AllOf(HasSubstr("cpu backend does not support"), HasSubstr("D = 300"), HasSubstr("maximum of 256")));
  EXPECT_NO_THROW(c.forward(Backend::reference));
}

// CUDA inputs as the CUDA path takes them (bf16 q, k, v; f32 w, beta) at head dimension D; nothing dereferenced.
Inputs cuda_inputs(int64_t D) {
  Inputs in;
  in.q = make_view(unreadable(), DType::bf16, {1, 64, 2, D}, Device::cuda);
  in.k = make_view(unreadable(), DType::bf16, {1, 64, 2, D}, Device::cuda);
  in.v = make_view(unreadable(), DType::bf16, {1, 64, 2, D}, Device::cuda);
  in.w = make_view(unreadable(), DType::f32, {1, 64, 2, D}, Device::cuda);
  in.beta = make_view(unreadable(), DType::f32, {1, 64, 2}, Device::cuda);
  return in;
}

// This build either has CUDA (then D = 96 is unsupported with a reason that names D) or it has not (then
// Backend::cuda says so, for supports() and forward alike). Which one is read from the answer for D = 64.
TEST(BadInputHeadDim, D96OnTheCudaBackend) {
  const Support at64 = supports(cuda_inputs(64), Backend::cuda);
  const Support at96 = supports(cuda_inputs(96), Backend::cuda);
  EXPECT_FALSE(at96.ok);
  if (!at64.ok && at64.reason.find("no CUDA support") != std::string::npos) {
    EXPECT_THAT(at96.reason, HasSubstr("no CUDA support"));
    Inputs in = cuda_inputs(64);
    TensorView o = make_view(unreadable(), DType::bf16, {1, 64, 2, 64}, Device::cuda);
    TensorView lse = make_view(unreadable(), DType::f32, {1, 64, 2}, Device::cuda);
    EXPECT_THAT(error_of([&] { forward(in, {o, lse, {}}, Backend::cuda); }),
                AllOf(HasSubstr("cuda backend does not support"), HasSubstr("no CUDA support")));
    EXPECT_THAT(error_of([&] { forward(in, {o, lse, {}}, Backend::automatic); }), HasSubstr("no CUDA support"));
  } else {
    EXPECT_THAT(at96.reason, HasSubstr("96"));
  }
}

TEST_F(BadInput, OutputOfWrongShape) {
  ForwardOutputs out = c.fwd_outputs(false);
  out.o.sizes[3] = 16;  // D instead of DV
  EXPECT_THAT(error_of([&] { forward(c.in, out); }),
              AllOf(HasSubstr("o (output) must have shape [1, 8, 4, 8]"), HasSubstr("got [1, 8, 4, 16]")));
}

TEST_F(BadInput, OutputOfWrongDtype) {
  Buffer<double> lse64({1, 8, 4}, DType::f64);
  ForwardOutputs out = c.fwd_outputs(false);
  out.lse = lse64.view;
  EXPECT_THAT(error_of([&] { forward(c.in, out); }),
              AllOf(HasSubstr("lse (output) must have dtype float32"), HasSubstr("got float64")));
}

TEST_F(BadInput, BroadcastOutput) {  // e.g. torch's expand(): every thread would write the same row
  ForwardOutputs out = c.fwd_outputs(false);
  out.o.strides[1] = 0;
  EXPECT_THAT(error_of([&] { forward(c.in, out); }),
              AllOf(HasSubstr("o (output) must not be a broadcast view"), HasSubstr("stride 0 in dimension 1")));
  c.forward(Backend::automatic);
  Gradients g = c.grads();
  g.dbeta.strides[2] = 0;
  EXPECT_THAT(error_of([&] { backward(c.in, c.o.view, c.lse.view, c.dout.view, g); }),
              HasSubstr("dbeta (output) must not be a broadcast view"));
}

// ...while a broadcast dout (torch's grad of sum() is an expanded tensor) is only read: accepted, same gradients.
TEST_F(BadInput, BroadcastOutputGradientIsValid) {
  Buffer<float> row({1, 1, 1, 8}, DType::f32);
  for (int d = 0; d < 8; ++d) row.data()[d] = 0.25f * d;
  TensorView dout = row.view;
  dout.ndim = 4;
  dout.sizes[1] = 8;  // [1, 8, 4, 8] with strides [., 0, 0, 1]
  dout.sizes[2] = 4;
  dout.strides[1] = dout.strides[2] = 0;
  for (int64_t t = 0; t < 8; ++t)
    for (int64_t h = 0; h < 4; ++h)
      for (int d = 0; d < 8; ++d) c.dout.data()[c.dout.off({0, t, h, d})] = 0.25f * d;
  c.forward(Backend::automatic);
  Case<float> b(P);
  b.forward(Backend::automatic);
  EXPECT_NO_THROW(backward(b.in, b.o.view, b.lse.view, dout, b.grads()));
  c.backward(Backend::automatic);
  EXPECT_EQ(b.dq.to_vector(), c.dq.to_vector());
}

// Outputs that alias an input or each other: the kernels would read what they already overwrote.
TEST_F(BadInput, OutputAliasingAnInput) {
  ForwardOutputs out = c.fwd_outputs(false);
  out.o.data = c.in.q.data;  // o written over q (f32 both, e.g. an in-place call)
  EXPECT_THAT(error_of([&] { forward(c.in, out); }), HasSubstr("o (output) shares memory with q"));
  c.forward(Backend::automatic);
  Gradients g = c.grads();
  g.dv.data = c.dout.view.data;
  EXPECT_THAT(error_of([&] { backward(c.in, c.o.view, c.lse.view, c.dout.view, g); }),
              HasSubstr("dv (output) shares memory with dout"));
}

TEST_F(BadInput, OutputsSharingMemory) {
  ForwardOutputs out = c.fwd_outputs(false);
  out.lse.data = static_cast<float*>(out.o.data) + 5;
  EXPECT_THAT(error_of([&] { forward(c.in, out); }), HasSubstr("o (output) and lse (output) share memory"));
}

// The check compares byte ranges: outputs in adjacent, disjoint parts of one buffer are accepted.
TEST_F(BadInput, OutputsInAdjacentPartsOfOneBufferAreValid) {
  std::vector<float> one(1 * 8 * 4 * 8 + 1 * 8 * 4, -1.f);
  ForwardOutputs out = c.fwd_outputs(false);
  out.o.data = one.data();              // [1, 8, 4, 8] contiguous: 256 floats
  out.lse.data = one.data() + 8 * 4 * 8;  // [1, 8, 4] right after it
  forward(c.in, out);
  c.forward(Backend::automatic);
  for (int i = 0; i < 8 * 4 * 8; ++i) EXPECT_EQ(one[i], c.o.data()[i]) << i;
}

TEST_F(BadInput, LseGradientOfWrongShape) {
  c.forward(Backend::automatic);
  TensorView dlse = c.dlse.view;
  dlse.sizes[2] = 2;
  EXPECT_THAT(error_of([&] { backward(c.in, c.o.view, c.lse.view, c.dout.view, dlse, c.grads()); }),
              AllOf(HasSubstr("dlse (backward input) must have shape [1, 8, 4]"), HasSubstr("got [1, 8, 2]")));
}

TEST_F(BadInput, MissingOutput) {
  ForwardOutputs out = c.fwd_outputs(false);
  out.lse = TensorView{};
  EXPECT_THAT(error_of([&] { forward(c.in, out); }), HasSubstr("lse (output) is required"));
}

TEST_F(BadInput, KcacheOfWrongShape) {
  ForwardOutputs out = c.fwd_outputs(true);
  out.kcache.sizes[2] = 4;  // HQ instead of H
  EXPECT_THAT(error_of([&] { forward(c.in, out); }),
              AllOf(HasSubstr("kcache (output) must have shape [1, 8, 2, 16]"), HasSubstr("got [1, 8, 4, 16]")));
}

TEST_F(BadInput, GradientOfWrongShape) {
  c.forward(Backend::automatic);
  Gradients g = c.grads();
  g.dw.sizes[2] = 4;
  EXPECT_THAT(error_of([&] { backward(c.in, c.o.view, c.lse.view, c.dout.view, g); }),
              AllOf(HasSubstr("dw (output) must have shape [1, 8, 2, 16]"), HasSubstr("got [1, 8, 4, 16]")));
}

TEST_F(BadInput, GateGradientMissing) {
  c.forward(Backend::automatic);
  Gradients g = c.grads();
  g.dg = TensorView{};
  EXPECT_THAT(error_of([&] { backward(c.in, c.o.view, c.lse.view, c.dout.view, g); }),
              HasSubstr("dg (output) is required"));
}

TEST_F(BadInput, OutputGradientOfWrongDtype) {
  c.forward(Backend::automatic);
  Buffer<double> dout64({1, 8, 4, 8}, DType::f64);
  EXPECT_THAT(error_of([&] { backward(c.in, c.o.view, c.lse.view, dout64.view, c.grads()); }),
              AllOf(HasSubstr("dout"), HasSubstr("must have dtype float32"), HasSubstr("got float64")));
}

// supports() answers "no, because ..." for valid but unsupported cases instead of throwing.
TEST(Supports, AnswersWithAReasonInsteadOfThrowing) {
  Problem64 P300(Spec{.B = 1, .T = 3, .H = 1, .HQ = 1, .D = 300, .DV = 8});
  Case<float> c300(P300);
  Support s;
  EXPECT_NO_THROW(s = supports(c300.in, Backend::cpu));
  EXPECT_FALSE(s.ok);
  EXPECT_FALSE(static_cast<bool>(s));
  EXPECT_THAT(s.reason, AllOf(HasSubstr("D = 300"), HasSubstr("256")));
  EXPECT_NO_THROW(s = supports(c300.in, Backend::cpu, /*backward=*/true));
  EXPECT_FALSE(s.ok);
  EXPECT_TRUE(supports(c300.in, Backend::reference).ok);

  Problem64 P(Spec{.B = 1, .T = 4, .H = 1, .HQ = 1, .D = 8, .DV = 8});
  Case<double> c64(P);  // f64 belongs to the reference
  EXPECT_NO_THROW(s = supports(c64.in, Backend::cpu));
  EXPECT_FALSE(s.ok);
  EXPECT_THAT(s.reason, HasSubstr("float32"));
  EXPECT_TRUE(supports(c64.in, Backend::reference).ok);
  EXPECT_TRUE(supports(c64.in, Backend::automatic).ok);

  Case<float> c32(P);  // CPU tensors on the CUDA backend
  EXPECT_NO_THROW(s = supports(c32.in, Backend::cuda));
  EXPECT_FALSE(s.ok);
  EXPECT_FALSE(s.reason.empty());
  EXPECT_TRUE(supports(c32.in, Backend::cpu).ok);

  EXPECT_NO_THROW(s = supports(cuda_inputs(64), Backend::reference));  // GPU tensors on the reference
  EXPECT_FALSE(s.ok);
  EXPECT_THAT(s.reason, HasSubstr("CPU tensors only"));
}

// Invalid (not merely unsupported) input is still an error from supports(): it names the argument.
TEST_F(BadInput, SupportsStillThrowsOnInvalidInput) {
  c.in.k.sizes[3] = 15;
  EXPECT_THAT(error_of([&] { (void)supports(c.in, Backend::cpu); }), HasSubstr("k must have shape"));
}

}  // namespace
}  // namespace pathattn::test
