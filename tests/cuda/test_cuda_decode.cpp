// The CUDA decode (src/cuda/kernels/decode.cuh) step by step. B sequences with different cache lengths (0, 1, a few
// chunks) are prefilled (the CPU forward's kcache, or the CUDA forward's), then decoded one token (or a few) per call
// on the GPU and, beside it, on the CPU from the same cache with the same rounded inputs. Checked:
//  (a) against the CPU decode: o within the output dtype's rounding plus kCudaDecodeVsCpu, lse and the cache (k, v,
//      gcum) within kCudaDecodeVsCpu, the lengths equal (tests/tolerances.h says why);
//  (b) against the f64 reference forward over each whole sequence, FlashAttention's rule (lowp_baseline.h): the
//      decoded positions' o and lse, and the final cache against the forward's kcache.
// Outputs start NaN-poisoned between guard bands; cache rows past each sequence's end start NaN and must stay so.
// Also: argument errors (wrong device, DV != D, D = 32), a sequence that does not fit (NaN, left alone), and one step
// captured in a CUDA graph replaying as the eager calls do, bit for bit. Label gpu: run by tools/gpu_check.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/launch/decode_launch.h"  // decode_uses_chunks
#include "decode_steps.h"  // rows(), step_inputs()
#include "device_buffers.h"
#include "device_inputs.h"
#include "expect_within.h"
#include "harness.h"
#include "lowp_baseline.h"
#include "lowp_round.h"
#include "tolerances.h"

namespace pathattn::test {
namespace {

struct DecodeCase {
  int64_t H = 1, HQ = 1, D = 64;
  bool gate = false;
  DType dt = DType::bf16;
  std::vector<int64_t> prompt;  // cached tokens per sequence before the first step (B = prompt.size())
  int64_t steps = 8;            // tokens decoded per sequence
  std::vector<int64_t> chunks;  // new tokens per decode call, cycled (empty: 1, a decoding step)
  BetaDist beta = BetaDist::uniform;
  bool gcum_f64 = true;         // cache.gcum in f64 (else f32)
  bool w_lowp = false;          // w given in bf16
  bool cuda_prefill = false;    // the prefill's kcache from the CUDA forward (bf16 / f16), else the CPU forward (f32)
  bool k_bf16 = false;          // cache.k in bf16 (rounded at every carry), else f32; see rounds_once_per_call
  bool v_low = false;           // cache.v in the inputs' dtype, else f32
  int64_t period = 0;           // > 0: a checkpointed cache of this period on both sides (docs/math.md Eq. 35-37)
  uint64_t seed = 1;
  std::string name() const {
    std::string s = "B" + std::to_string(prompt.size()) + "_H" + std::to_string(H) + "_HQ" + std::to_string(HQ) +
                    "_D" + std::to_string(D) + (dt == DType::bf16 ? "_bf16" : "_f16") + (gate ? "_gate" : "") + "_p";
    for (size_t i = 0; i < prompt.size(); ++i) s += (i ? "x" : "") + std::to_string(prompt[i]);
    s += "_n" + std::to_string(steps) + "_beta" + beta_name(beta);
    if (!chunks.empty()) s += "_chunked";
    if (gate && !gcum_f64) s += "_gcum32";
    if (w_lowp) s += "_wbf16";
    if (cuda_prefill) s += "_cudaprefill";
    if (k_bf16) s += "_kbf16";
    if (v_low) s += "_vlow";
    if (period) s += "_ckpt" + std::to_string(period);
    return s;
  }
};
void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name() << "_seed" << c.seed; }

// Rows [0, T) of batch row b of P, as a problem of its own (B = 1).
Problem64 slice(const Problem64& P, int64_t b, int64_t T) {
  Spec s = P.spec;
  s.B = 1;
  s.T = 0;
  Problem64 R(s);  // draws nothing at T = 0
  R.spec.T = T;
  const int64_t Tp = P.spec.T;
  auto cut = [&](const std::vector<double>& x, int64_t width) {
    return std::vector<double>(x.begin() + b * Tp * width, x.begin() + (b * Tp + T) * width);
  };
  R.q = cut(P.q, s.HQ * s.D);
  R.k = cut(P.k, s.H * s.D);
  R.v = cut(P.v, s.H * s.DV);
  R.w = cut(P.w, s.H * s.D);
  R.beta = cut(P.beta, s.H);
  if (s.gate) R.g = cut(P.g, s.HQ);
  return R;
}

// P as the kernels get it: q, k, v rounded to dt, w to f32 (bf16 when w_lowp), beta and g to f32. The CPU decode
// runs on these values in f32, so that (a) compares computations, not input roundings.
Problem64 as_given(const Problem64& P, DType dt, bool w_lowp) {
  Problem64 R = P;
  for (std::vector<double>* x : {&R.q, &R.k, &R.v})
    for (double& e : *x) e = round_to(static_cast<float>(e), dt);
  for (double& e : R.w) e = w_lowp ? round_to(static_cast<float>(e), DType::bf16) : static_cast<float>(e);
  for (std::vector<double>* x : {&R.beta, &R.g})
    for (double& e : *x) e = static_cast<float>(e);
  return R;
}

// ||got - want|| <= rel ||want|| (L2), NaN never passing; prints the margin.
void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double r = bound_ratio(got, want, rel, 0.0);
  EXPECT_LE(r, 1.0) << what << ": relative error " << rel_err(got, want) << " > " << rel;
  std::printf("  %-12s vs CPU decode: rel err %.3e (ratio to bound %.3f)\n", what, rel_err(got, want), r);
}

template <typename X>
std::vector<double> download(const DevTensor& t) {
  std::vector<double> r;
  for (X x : t.buf.download<X>()) r.push_back(static_cast<double>(x));
  return r;
}

class CudaDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(CudaDecode, MatchesCpuDecodeAndReference) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const DecodeCase dc = GetParam();
  const int64_t B = static_cast<int64_t>(dc.prompt.size()), H = dc.H, HQ = dc.HQ, D = dc.D, N = dc.steps;
  const int64_t maxp = *std::max_element(dc.prompt.begin(), dc.prompt.end());
  const int64_t Tp = maxp + N, Tmax = Tp + 2;  // two spare rows past the longest sequence, which must stay NaN
  const Spec spec{.B = B, .T = Tp, .H = H, .HQ = HQ, .D = D, .DV = D, .gate = dc.gate, .beta = dc.beta, .seed = dc.seed};
  const Problem64 P(spec);
  const Problem64 Pg = as_given(P, dc.dt, dc.w_lowp);
  std::printf("%s\n", dc.name().c_str());

  // The cache before the first step: rows [0, prompt_b) from a prefill, every other row NaN.
  std::vector<double> hk(B * Tmax * H * D, NAN), hv(B * Tmax * H * D, NAN), hg(B * Tmax * HQ, NAN);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = dc.prompt[b];
    if (p == 0) continue;
    const Problem64 Pb = slice(Pg, b, p);
    std::vector<double> kc;
    if (dc.cuda_prefill) {
      const Problem64 Pu = slice(P, b, p);  // rounded by the upload, as a user's tensors would be
      const GpuSpec gs{Pu.spec, dc.dt, dc.w_lowp};
      DevInputs dev(Pu, gs);
      DevOut o({1, p, HQ, D}, dc.dt), lse({1, p, HQ}, DType::f32), kco({1, p, H, D}, dc.dt);
      ASSERT_NO_THROW(pathattn::forward(dev.in, ForwardOutputs{o.view, lse.view, kco.view}, Backend::cuda));
      TEST_CUDA(cudaDeviceSynchronize());
      kc = kco.to_vector();
    } else {
      Case<float> c(Pb);
      c.forward(Backend::cpu, true);
      kc = c.kcache.to_vector();
    }
    for (int64_t t = 0; t < p; ++t)
      for (int64_t e = 0; e < H * D; ++e) {
        hk[(b * Tmax + t) * H * D + e] = kc[t * H * D + e];
        hv[(b * Tmax + t) * H * D + e] = Pb.v[t * H * D + e];
      }
    if (dc.gate)
      for (int64_t j = 0; j < HQ; ++j) {
        double acc = 0;  // G_t in f64 (docs/spec.md §6), stored in the cache's dtype
        for (int64_t t = 0; t < p; ++t) {
          acc += Pb.g[t * HQ + j];
          hg[(b * Tmax + t) * HQ + j] = dc.gcum_f64 ? acc : static_cast<double>(static_cast<float>(acc));
        }
      }
  }
  const DType gdt = dc.gcum_f64 ? DType::f64 : DType::f32;
  const std::vector<double> hlen(dc.prompt.begin(), dc.prompt.end());

  // Device cache and the CPU decode's twin, from the same numbers. A bf16 key cache: the twin (an f32 cache) is
  // rounded to bf16 before the first step and after every step, as the kernel stores each carried row; the CPU
  // decode computes in f32 from those rows, as the kernel does. (A call of S > 1 tokens would round once per call
  // on the CPU but once per token on the GPU: bf16 cases take single steps.) Values in the inputs' dtype are exact.
  const DType kdt = dc.k_bf16 ? DType::bf16 : DType::f32, vdt = dc.v_low ? dc.dt : DType::f32;
  DevTensor dk(hk, {B, Tmax, H, D}, kdt, false), dv(hv, {B, Tmax, H, D}, vdt, false),
      dg(hg, {B, Tmax, HQ}, gdt, false), dlen(hlen, {B}, DType::i32, false);
  Buffer<float> ck({B, Tmax, H, D}, DType::f32), cv({B, Tmax, H, D}, DType::f32);
  Buffer<double> cg64({B, Tmax, HQ}, DType::f64);
  Buffer<float> cg32({B, Tmax, HQ}, DType::f32);
  Buffer<int32_t> clen({B}, DType::i32);
  ck.fill_from(hk);
  cv.fill_from(hv);
  cg64.fill_from(hg);
  cg32.fill_from(hg);
  for (int64_t b = 0; b < B; ++b) clen.data()[b] = static_cast<int32_t>(dc.prompt[b]);
  auto round_twin_keys = [&] {
    if (!dc.k_bf16) return;
    float* x = ck.data();
    for (int64_t e = 0; e < B * Tmax * H * D; ++e) x[e] = std::isnan(x[e]) ? x[e] : round_to(x[e], DType::bf16);
  };
  // The twin rounds once per call, the kernels once per pass over the cache: per token in single steps, per call of
  // <= 64 tokens in the chunked decode (plain cache, calls of at least PATHATTN_DECODE_CHUNK tokens, default 4). A
  // bf16 key cache case with calls of several tokens therefore runs only where every call rounds once.
  const bool rounds_once_per_call = std::all_of(dc.chunks.begin(), dc.chunks.end(), [&](int64_t S) {
    return S == 1 || (!dc.period && cuda::decode_uses_chunks(false, S) && S <= 64);
  });
  if (dc.k_bf16 && !rounds_once_per_call)
    GTEST_SKIP() << "a bf16 key cache with these calls needs the chunked decode for each (PATHATTN_DECODE_CHUNK=1)";
  round_twin_keys();

  // The new tokens: token n of sequence b (position prompt_b + n) at [b, n].
  auto stepped = [&](const std::vector<double>& x, int64_t width) {
    std::vector<double> r(B * N * width);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < width; ++i) r[(b * N + n) * width + i] = x[(b * Tp + dc.prompt[b] + n) * width + i];
    return r;
  };
  DevTensor sq(stepped(P.q, HQ * D), {B, N, HQ, D}, dc.dt, false), sk(stepped(P.k, H * D), {B, N, H, D}, dc.dt, false),
      sv(stepped(P.v, H * D), {B, N, H, D}, dc.dt, false),
      sw(stepped(P.w, H * D), {B, N, H, D}, dc.w_lowp ? DType::bf16 : DType::f32, false),
      sbeta(stepped(P.beta, H), {B, N, H}, DType::f32, false);
  std::unique_ptr<DevTensor> sg;
  if (dc.gate) sg = std::make_unique<DevTensor>(stepped(P.g, HQ), std::vector<int64_t>{B, N, HQ}, DType::f32, false);
  Inputs din{sq.view, sk.view, sv.view, sw.view, sbeta.view, dc.gate ? sg->view : TensorView{}, {}, {}};
  Buffer<float> cq({B, N, HQ, D}, DType::f32), ckn({B, N, H, D}, DType::f32), cvn({B, N, H, D}, DType::f32),
      cw({B, N, H, D}, DType::f32), cbeta({B, N, H}, DType::f32), cgn({B, N, HQ}, DType::f32);
  cq.fill_from(stepped(Pg.q, HQ * D));
  ckn.fill_from(stepped(Pg.k, H * D));
  cvn.fill_from(stepped(Pg.v, H * D));
  cw.fill_from(stepped(Pg.w, H * D));
  cbeta.fill_from(stepped(Pg.beta, H));
  if (dc.gate) cgn.fill_from(stepped(Pg.g, HQ));
  Inputs cin{cq.view, ckn.view, cvn.view, cw.view, cbeta.view, dc.gate ? cgn.view : TensorView{}, {}, {}};

  DevOut go({B, N, HQ, D}, dc.dt), glse({B, N, HQ}, DType::f32);
  Buffer<float> co({B, N, HQ, D}, DType::f32), clse({B, N, HQ}, DType::f32);
  DecodeCache dcache{dk.view, dv.view, dc.gate ? dg.view : TensorView{}, dlen.view};
  DecodeCache ccache{ck.view, cv.view, dc.gate ? (dc.gcum_f64 ? cg64.view : cg32.view) : TensorView{}, clen.view};
  // A checkpointed cache on both sides: the checkpoint at each prompt's end (the prefill's keys are carried to it),
  // nothing pending, so the carry's content is ignored (zeros here).
  const std::vector<double> zeros_carry(B * H * D * D, 0.0);
  DevTensor dckpt(hlen, {B}, DType::i32, false), dcarry(zeros_carry, {B, H, D, D}, DType::f32, false);
  Buffer<int32_t> cckpt({B}, DType::i32);
  Buffer<float> ccarry({B, H, D, D}, DType::f32);
  if (dc.period) {
    ccarry.fill_from(zeros_carry);
    for (int64_t b = 0; b < B; ++b) cckpt.data()[b] = static_cast<int32_t>(dc.prompt[b]);
    dcache.ckpt = dckpt.view;
    dcache.carry = dcarry.view;
    dcache.ckpt_period = dc.period;
    ccache.ckpt = cckpt.view;
    ccache.carry = ccarry.view;
    ccache.ckpt_period = dc.period;
  }
  ASSERT_TRUE(supports(din, Backend::cuda, Op::decode).ok) << supports(din, Backend::cuda, Op::decode).reason;
  for (int64_t n = 0, call = 0; n < N; ++call) {
    const int64_t S = std::min<int64_t>(dc.chunks.empty() ? 1 : dc.chunks[call % dc.chunks.size()], N - n);
    ASSERT_NO_THROW(pathattn::decode(step_inputs(din, n, S), dcache,
                                     ForwardOutputs{rows(go.view, n, S), rows(glse.view, n, S), {}}, Backend::cuda));
    ASSERT_NO_THROW(pathattn::decode(step_inputs(cin, n, S), ccache,
                                     ForwardOutputs{rows(co.view, n, S), rows(clse.view, n, S), {}}, Backend::cpu));
    round_twin_keys();
    n += S;
  }
  TEST_CUDA(cudaDeviceSynchronize());

  const std::vector<double> o = go.to_vector(), lse = glse.to_vector();
  EXPECT_EQ(count_nonfinite(o), 0) << "o has unwritten (NaN-poisoned) or non-finite elements";
  EXPECT_EQ(count_nonfinite(lse), 0) << "lse has unwritten or non-finite elements";
  EXPECT_TRUE(go.buf.guards_intact() && glse.buf.guards_intact()) << "a write outside o or lse";
  EXPECT_TRUE(dk.buf.guards_intact() && dv.buf.guards_intact() && dg.buf.guards_intact() && dlen.buf.guards_intact())
      << "a write outside the cache";
  auto download_cache = [](const DevTensor& t, DType dt) {
    if (dt == DType::f32) return download<float>(t);
    std::vector<double> r;
    for (uint16_t u : t.buf.download<uint16_t>()) r.push_back(from_lowp(u, dt));
    return r;
  };
  const std::vector<double> gk = download_cache(dk, kdt), gv = download_cache(dv, vdt);
  const std::vector<double> gg = dc.gcum_f64 ? download<double>(dg) : download<float>(dg);
  const std::vector<double> glen = download<int32_t>(dlen);
  std::vector<double> gckpt, gcarry;
  if (dc.period) {
    gckpt = download<int32_t>(dckpt);
    gcarry = download<float>(dcarry);
    for (int64_t b = 0; b < B; ++b) EXPECT_EQ(gckpt[b], cckpt.data()[b]) << "ckpt[" << b << "] vs the CPU's";
  }
  // The checkpointed cache's keys as the plain cache holds them (decode_steps.h), for (b) below.
  const std::vector<double> gk_plain = dc.period ? materialized_keys(gk, Tmax, H, D, gckpt, glen, gcarry) : gk;

  // The cache's rows [0, T_b) of every sequence; rows past them must still be NaN (never written).
  auto valid_rows = [&](const std::vector<double>& x, int64_t width, bool device) {
    std::vector<double> r;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t Tb = dc.prompt[b] + N;
      for (int64_t t = 0; t < Tmax; ++t)
        for (int64_t i = 0; i < width; ++i) {
          const double e = x[(b * Tmax + t) * width + i];
          if (t < Tb)
            r.push_back(e);
          else if (device)
            EXPECT_TRUE(std::isnan(e)) << "cache row " << t << " of sequence " << b << " (length " << Tb << ") was written";
        }
    }
    return r;
  };

  // (a) The CPU decode on the same inputs and cache. With a bf16 key cache the two sides round rows that differ by
  // f32 rounding, which now and then lands on different sides of a bf16 rounding boundary: such an element differs
  // by one bf16 ulp, in a small fraction of the elements, so the cache (and through it lse) may differ by the bf16
  // unit roundoff on top (tests/tolerances.h).
  const double u = dc.dt == DType::bf16 ? tol::kBf16UnitRoundoff : tol::kF16UnitRoundoff;
  const double uk = dc.k_bf16 ? tol::kBf16UnitRoundoff : 0.0;
  expect_close("o", o, co.to_vector(), u + uk + tol::kCudaDecodeVsCpu);
  expect_close("lse", lse, clse.to_vector(), uk + tol::kCudaDecodeVsCpu);
  expect_close("cache.k", valid_rows(gk, H * D, true), valid_rows(ck.to_vector(), H * D, false),
               uk + tol::kCudaDecodeVsCpu);
  expect_close("cache.v", valid_rows(gv, H * D, true), valid_rows(cv.to_vector(), H * D, false), tol::kCudaDecodeVsCpu);
  if (dc.gate)
    expect_close("cache.gcum", valid_rows(gg, HQ, true),
                 valid_rows(dc.gcum_f64 ? cg64.to_vector() : cg32.to_vector(), HQ, false), tol::kCudaDecodeVsCpu);
  for (int64_t b = 0; b < B; ++b) {
    EXPECT_EQ(glen[b], dc.prompt[b] + N) << "lengths[" << b << "]";
    EXPECT_EQ(clen.data()[b], dc.prompt[b] + N) << "the CPU decode's lengths[" << b << "]";
  }

  // (b) The f64 reference forward over each whole sequence, FlashAttention's rule. The low-precision baseline is
  // the plain low-precision forward (lowp_baseline.h); with a bf16 key cache it is the twin instead, the same
  // decode done plainly: f32 arithmetic on a cache rounded to bf16 at every step, o rounded to the output dtype.
  const std::vector<double> twin_o = co.to_vector(), twin_lse = clse.to_vector(), twin_k = ck.to_vector();
  std::vector<double> ro, bo, xo, rl, bl, xl, rk, bk, xk;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = dc.prompt[b], Tb = p + N;
    const Problem64 Pb = slice(P, b, Tb);
    Case<double> r(Pb);
    r.forward(Backend::reference, true);
    const LowpResult base = lowp_forward(Pb, dc.dt, dc.w_lowp);
    const std::vector<double> r_o = r.o.to_vector(), r_lse = r.lse.to_vector(), r_kc = r.kcache.to_vector();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t e = 0; e < HQ * D; ++e) {
        ro.push_back(r_o[(p + n) * HQ * D + e]);
        bo.push_back(dc.k_bf16 ? round_to(static_cast<float>(twin_o[(b * N + n) * HQ * D + e]), dc.dt)
                               : base.o[(p + n) * HQ * D + e]);
        xo.push_back(o[(b * N + n) * HQ * D + e]);
      }
      for (int64_t j = 0; j < HQ; ++j) {
        rl.push_back(r_lse[(p + n) * HQ + j]);
        bl.push_back(dc.k_bf16 ? twin_lse[(b * N + n) * HQ + j] : base.lse[(p + n) * HQ + j]);
        xl.push_back(lse[(b * N + n) * HQ + j]);
      }
    }
    for (int64_t e = 0; e < Tb * H * D; ++e) {
      rk.push_back(r_kc[e]);
      bk.push_back(dc.k_bf16 ? twin_k[b * Tmax * H * D + e] : base.kcache[e]);
      xk.push_back(gk_plain[b * Tmax * H * D + e]);
    }
  }
  std::printf(" against the f64 reference forward:\n");
  expect_within("o", xo, ro, bo);
  expect_within("lse", xl, rl, bl);
  expect_within("cache.k", xk, rk, bk);
}

std::vector<DecodeCase> cases() {
  using BD = BetaDist;
  std::vector<DecodeCase> c;
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128})
      for (bool gate : {false, true})  // GQA 4:1, lengths 0, 1 and across chunks
        c.push_back({.H = 2, .HQ = 8, .D = D, .gate = gate, .dt = dt, .prompt = {0, 1, 77}, .steps = 40,
                     .seed = 100 + uint64_t(D) + gate});
  // No GQA; a group of 3 (a masked head in the 4-head pass); a group of 16 (two passes of 8, the second reading
  // the rows the first carried).
  c.push_back({.H = 2, .HQ = 2, .D = 64, .prompt = {10, 100, 3}, .steps = 20, .beta = BD::near1, .seed = 1});
  c.push_back({.H = 2, .HQ = 6, .D = 64, .gate = true, .dt = DType::f16, .prompt = {33, 0, 64}, .steps = 20,
               .beta = BD::near2, .seed = 2});
  c.push_back({.H = 1, .HQ = 16, .D = 128, .gate = true, .prompt = {20, 0, 150}, .steps = 20, .beta = BD::high,
               .seed = 3});
  // f32 cumulative gates; w in bf16.
  c.push_back({.H = 2, .HQ = 4, .D = 64, .gate = true, .prompt = {5, 64, 130}, .steps = 30, .gcum_f64 = false,
               .w_lowp = true, .seed = 4});
  // Calls of several tokens (chunks of <= 64 for calls of at least PATHATTN_DECODE_CHUNK tokens, default 4:
  // kernels/decode_chunk.cuh; single steps in order below that) mixed with single steps.
  c.push_back({.H = 2, .HQ = 4, .D = 64, .gate = true, .prompt = {3, 70, 0}, .steps = 40, .chunks = {1, 3, 1, 7, 1, 1, 26},
               .seed = 5});
  c.push_back({.H = 1, .HQ = 2, .D = 128, .dt = DType::f16, .prompt = {1, 9}, .steps = 24, .chunks = {5, 2, 17},
               .beta = BD::exact2, .seed = 6});
  // Chunks: a full chunk of 64 (a group of 4: 256 query rows, four passes of the chunked split kernel, the last one
  // carrying) from lengths 0, 1 and across chunks; one call of 100 tokens (two chunks, 64 + 36) with a group of 16
  // and f32 cumulative gates; bf16 keys with values in the inputs' dtype (w in bf16), D 64 and 128.
  c.push_back({.H = 2, .HQ = 8, .D = 64, .gate = true, .prompt = {0, 1, 130}, .steps = 150,
               .chunks = {64, 1, 36, 2, 47}, .seed = 24});
  c.push_back({.H = 1, .HQ = 16, .D = 128, .gate = true, .dt = DType::f16, .prompt = {5, 200}, .steps = 100,
               .chunks = {100}, .beta = BD::near2, .gcum_f64 = false, .seed = 25});
  c.push_back({.H = 2, .HQ = 4, .D = 64, .gate = true, .prompt = {0, 70}, .steps = 40, .chunks = {8, 31, 1},
               .w_lowp = true, .k_bf16 = true, .v_low = true, .seed = 26});
  c.push_back({.H = 2, .HQ = 2, .D = 128, .prompt = {3, 129}, .steps = 30, .chunks = {2, 16, 12}, .beta = BD::high,
               .k_bf16 = true, .v_low = true, .seed = 27});
  // The prefill's cache from the CUDA forward (kcache in bf16 / f16).
  c.push_back({.H = 2, .HQ = 8, .D = 64, .gate = true, .prompt = {100, 65, 1}, .steps = 20, .cuda_prefill = true, .seed = 7});
  c.push_back({.H = 1, .HQ = 4, .D = 128, .dt = DType::f16, .prompt = {64, 2}, .steps = 20, .cuda_prefill = true, .seed = 8});
  // 1,000 decoding steps: the carried cache over many updates, the gate's G over a long sequence.
  c.push_back({.H = 1, .HQ = 4, .D = 64, .gate = true, .prompt = {24}, .steps = 1000, .seed = 9});
  // The checkpointed cache: refreshes every 16 / 5 / 7 / 64 tokens (GQA, gate, lengths 0, 1, across chunks; calls
  // of several tokens; bf16 keys; D 128 over 300 steps), against the CPU's checkpointed decode and the reference.
  c.push_back({.H = 2, .HQ = 8, .D = 64, .gate = true, .prompt = {0, 1, 77}, .steps = 40, .period = 16, .seed = 14});
  c.push_back({.H = 2, .HQ = 4, .D = 64, .gate = true, .prompt = {3, 70, 0}, .steps = 40, .chunks = {1, 3, 1, 7, 26},
               .period = 5, .seed = 15});
  c.push_back({.H = 2, .HQ = 8, .D = 128, .dt = DType::f16, .prompt = {65, 3}, .steps = 30, .beta = BD::near2,
               .k_bf16 = true, .v_low = true, .period = 7, .seed = 16});
  c.push_back({.H = 1, .HQ = 16, .D = 128, .gate = true, .prompt = {40}, .steps = 300, .period = 64, .seed = 17});
  // Low-precision caches: bf16 keys with values in the inputs' dtype (bf16, f16; D 64, 128; GQA, gate, lengths 0
  // and across chunks), values alone in the inputs' dtype, and bf16 keys over 300 steps.
  c.push_back({.H = 2, .HQ = 8, .D = 64, .gate = true, .prompt = {0, 1, 77}, .steps = 40, .k_bf16 = true,
               .v_low = true, .seed = 10});
  c.push_back({.H = 2, .HQ = 4, .D = 128, .dt = DType::f16, .prompt = {65, 3}, .steps = 30, .beta = BD::near2,
               .k_bf16 = true, .v_low = true, .seed = 11});
  c.push_back({.H = 2, .HQ = 4, .D = 64, .dt = DType::f16, .prompt = {5, 70}, .steps = 20, .chunks = {1, 4, 15},
               .v_low = true, .seed = 12});
  c.push_back({.H = 1, .HQ = 2, .D = 128, .gate = true, .prompt = {40}, .steps = 300, .k_bf16 = true, .seed = 13});
  // 16-bit keys and values (the tensor-core kernel for bf16, kernels/decode_mma.cuh, by default, and the split
  // kernel's prefetching instances, kernels/decode.cuh, for f16 and with PATHATTN_DECODE_MMA=0; tools/gpu_check.sh
  // decode runs this binary both ways): no GQA (kG = 1) at D 128 over lengths that are not multiples of a block's
  // rows, a group of 16 (two passes of 8, the second rereading the rows the first carried), a group of 8 at D 128
  // (every head row of the tensor-core kernel's pass) with the gate over 200 steps from lengths 0 and 1, and a group
  // of 3 (masked head rows) with beta near 2.
  c.push_back({.H = 2, .HQ = 2, .D = 128, .prompt = {300, 5, 129}, .steps = 20, .k_bf16 = true, .v_low = true,
               .seed = 18});
  c.push_back({.H = 1, .HQ = 16, .D = 64, .gate = true, .prompt = {20, 0, 257}, .steps = 20, .beta = BD::high,
               .k_bf16 = true, .v_low = true, .seed = 19});
  c.push_back({.H = 2, .HQ = 16, .D = 128, .gate = true, .prompt = {0, 1, 140}, .steps = 200, .k_bf16 = true,
               .v_low = true, .seed = 20});
  c.push_back({.H = 2, .HQ = 6, .D = 64, .prompt = {31, 2}, .steps = 20, .beta = BD::near2, .k_bf16 = true,
               .v_low = true, .seed = 21});
  // The checkpointed cache with bf16 inputs, keys and values (the tensor-core kernel's kCkpt instances: 7 heads
  // per pass, so a group of 8 takes two; old and recent rows in one 16-row block; refreshes every 16 / 7 tokens).
  c.push_back({.H = 2, .HQ = 16, .D = 64, .gate = true, .prompt = {0, 1, 77}, .steps = 40, .k_bf16 = true,
               .v_low = true, .period = 16, .seed = 22});
  c.push_back({.H = 1, .HQ = 4, .D = 128, .prompt = {65, 3}, .steps = 30, .beta = BD::near2, .k_bf16 = true,
               .v_low = true, .period = 7, .seed = 23});
  return c;
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaDecode, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// A small problem's step inputs on the device, for the tests below: [B, S, ...], B = lens.size().
struct SmallStep {
  Problem64 P;
  DevTensor q, k, v, w, beta, g;
  Inputs in;
  SmallStep(int64_t B, int64_t S, int64_t H, int64_t HQ, int64_t D, int64_t DV, uint64_t seed)
      : P(Spec{.B = B, .T = S, .H = H, .HQ = HQ, .D = D, .DV = DV, .gate = true, .seed = seed}),
        q(P.q, {B, S, HQ, D}, DType::bf16, false),
        k(P.k, {B, S, H, D}, DType::bf16, false),
        v(P.v, {B, S, H, DV}, DType::bf16, false),
        w(P.w, {B, S, H, D}, DType::f32, false),
        beta(P.beta, {B, S, H}, DType::f32, false),
        g(P.g, {B, S, HQ}, DType::f32, false) {
    in = Inputs{q.view, k.view, v.view, w.view, beta.view, g.view, {}, {}};
  }
};

// A device cache of random rows (keys, values; decreasing cumulative gates f64): the kernels read rows [0, lens[b]).
struct SmallCache {
  DevTensor k, v, g, len;
  static std::vector<double> rnd(int64_t n, uint64_t seed, double lo, double hi) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> x(n);
    for (double& e : x) e = u(rng);
    return x;
  }
  SmallCache(const std::vector<int64_t>& lens, int64_t Tmax, int64_t H, int64_t HQ, int64_t D, int64_t DV)
      : k(rnd(lens.size() * Tmax * H * D, 1, -1, 1), {int64_t(lens.size()), Tmax, H, D}, DType::f32, false),
        v(rnd(lens.size() * Tmax * H * DV, 2, -1, 1), {int64_t(lens.size()), Tmax, H, DV}, DType::f32, false),
        g(gates(lens.size(), Tmax, HQ), {int64_t(lens.size()), Tmax, HQ}, DType::f64, false),
        len(std::vector<double>(lens.begin(), lens.end()), {int64_t(lens.size())}, DType::i32, false) {}
  static std::vector<double> gates(int64_t B, int64_t Tmax, int64_t HQ) {
    std::vector<double> x(B * Tmax * HQ);
    for (int64_t i = 0; i < B * Tmax * HQ; ++i) x[i] = -0.3 * static_cast<double>((i / HQ) % Tmax);
    return x;
  }
  DecodeCache view() const { return DecodeCache{k.view, v.view, g.view, len.view}; }
};

::testing::AssertionResult Mentions(const std::string& msg, const std::string& words) {
  if (msg.find(words) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << words << "\"";
}

// Arguments the CUDA decode refuses, each with pathattn::Error naming it; nothing is written.
TEST(CudaDecodeErrors, NamedErrors) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  auto msg = [](const Inputs& in, const DecodeCache& c, const ForwardOutputs& out) {
    try {
      pathattn::decode(in, c, out, Backend::automatic);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  {
    SmallStep st(1, 1, 1, 2, 64, 64, 41);
    SmallCache dc({3}, 8, 1, 2, 64, 64);
    DevOut o({1, 1, 2, 64}, DType::bf16), lse({1, 1, 2}, DType::f32);
    const ForwardOutputs out{o.view, lse.view, {}};
    EXPECT_TRUE(supports(st.in, Backend::cuda, Op::decode).ok) << supports(st.in, Backend::cuda, Op::decode).reason;
    // A cache on the host with inputs on the device.
    Buffer<float> hk({1, 8, 1, 64}, DType::f32), hv({1, 8, 1, 64}, DType::f32);
    Buffer<double> hg({1, 8, 2}, DType::f64);
    Buffer<int32_t> hl({1}, DType::i32);
    hl.data()[0] = 3;
    EXPECT_TRUE(Mentions(msg(st.in, DecodeCache{hk.view, hv.view, hg.view, hl.view}, out),
                         "cache.k (output) must be on the device of q (cuda:0), got cpu:0"));
    // Lengths on the host with the cache on the device.
    DecodeCache host_len = dc.view();
    host_len.lengths = hl.view;
    EXPECT_TRUE(Mentions(msg(st.in, host_len, out), "cache.lengths must be an int32 tensor on q's CUDA device"));
    // More new tokens than the cache has rows.
    SmallStep big(1, 9, 1, 2, 64, 64, 42);
    DevOut o9({1, 9, 2, 64}, DType::bf16), l9({1, 9, 2}, DType::f32);
    EXPECT_TRUE(Mentions(msg(big.in, dc.view(), {o9.view, l9.view, {}}), "do not fit the cache's Tmax = 8"));
    // The gate without cumulative gates in the cache.
    DecodeCache no_g = dc.view();
    no_g.gcum = TensorView{};
    EXPECT_TRUE(Mentions(msg(st.in, no_g, out), "cache.gcum [B, Tmax, HQ] is required when g is given"));
    TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(download<int32_t>(dc.len)[0], 3) << "a refused call must not advance the cache";
  }
  // DV != D and D = 32: the CUDA forward's reasons.
  for (auto [D, DV, expect] : {std::tuple{64, 32, "DV == D"}, {32, 32, "D = 64 or 128"}}) {
    SmallStep st(1, 1, 1, 1, D, DV, 43);
    SmallCache dc({2}, 4, 1, 1, D, DV);
    DevOut o({1, 1, 1, DV}, DType::bf16), lse({1, 1, 1}, DType::f32);
    const Support s = supports(st.in, Backend::cuda, Op::decode);
    EXPECT_FALSE(s.ok);
    EXPECT_TRUE(Mentions(s.reason, expect));
    EXPECT_TRUE(Mentions(msg(st.in, dc.view(), {o.view, lse.view, {}}), expect));
  }
}

// lengths live on the device, so the host cannot refuse a sequence that does not fit: the kernels give it NaN o and
// lse for every token of the call and leave its cache and length as they were; the other sequences decode.
TEST(CudaDecode, ASequenceThatDoesNotFitGetsNaNAndIsLeftAlone) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t Tmax = 6, H = 1, HQ = 2, D = 64;
  for (int64_t S : {1, 2, 4}) {  // S = 4: the chunked kernels (by default; S = 2 with PATHATTN_DECODE_CHUNK=1)
    // Sequence 0: full (S = 1) or one row short of the two new tokens (S = 2); 1: room; 2: a negative length.
    SmallCache dc({S == 1 ? 6 : 5, 1, -1}, Tmax, H, HQ, D, D);
    const std::vector<double> k0 = download<float>(dc.k), v0 = download<float>(dc.v), g0 = download<double>(dc.g);
    SmallStep st(3, S, H, HQ, D, D, 44);
    DevOut o({3, S, HQ, D}, DType::bf16), lse({3, S, HQ}, DType::f32);
    ASSERT_NO_THROW(pathattn::decode(st.in, dc.view(), {o.view, lse.view, {}}, Backend::cuda));
    TEST_CUDA(cudaDeviceSynchronize());
    const std::vector<double> go = o.to_vector(), gl = lse.to_vector(), len = download<int32_t>(dc.len);
    const std::vector<double> k1 = download<float>(dc.k), v1 = download<float>(dc.v), g1 = download<double>(dc.g);
    for (int64_t b = 0; b < 3; ++b) {
      const bool fits = b == 1;
      for (int64_t i = 0; i < S * HQ * D; ++i)
        ASSERT_EQ(std::isfinite(go[b * S * HQ * D + i]), fits) << "S " << S << " sequence " << b << " o[" << i << "]";
      for (int64_t i = 0; i < S * HQ; ++i)
        ASSERT_EQ(std::isfinite(gl[b * S * HQ + i]), fits) << "S " << S << " sequence " << b << " lse[" << i << "]";
      for (int64_t i = 0; !fits && i < Tmax * H * D; ++i) {
        const int64_t e = b * Tmax * H * D + i;
        ASSERT_TRUE(k1[e] == k0[e] || (std::isnan(k1[e]) && std::isnan(k0[e]))) << "cache.k of sequence " << b;
        ASSERT_TRUE(v1[e] == v0[e] || (std::isnan(v1[e]) && std::isnan(v0[e]))) << "cache.v of sequence " << b;
      }
      for (int64_t i = 0; !fits && i < Tmax * HQ; ++i) ASSERT_EQ(g1[b * Tmax * HQ + i], g0[b * Tmax * HQ + i]);
    }
    EXPECT_EQ(len[0], S == 1 ? 6 : 5);
    EXPECT_EQ(len[1], 1 + S);
    EXPECT_EQ(len[2], -1);
  }
}

// A call of S tokens (chunks of <= 64 from S = 4 by default: one pass over the cache per chunk, Eq. 43) equals the
// same tokens decoded one per call (S passes), on the same cache, to rounding: o, lse, the whole cache, the lengths.
// S = 9 (one chunk, a group of 4: 36 query rows in one pass), 64 (a full chunk: four passes) and 70
// (two chunks in one call); lengths 0, 3 and 70.
// Two equal caches (lengths 0, 3 and 70; H 2, HQ 8, D 64, Tmax 160), the inputs of a call of S tokens and an output
// pair for each cache: the two tests below decode the same tokens into each in two ways.
struct TwoCaches {
  static constexpr int64_t H = 2, HQ = 8, D = 64, Tmax = 160, B = 3;
  const std::vector<int64_t> lens = {0, 3, 70};
  SmallCache a, b;
  SmallStep st;
  DevOut oa, la, ob, lb;
  TwoCaches(int64_t S, uint64_t seed)
      : a(lens, Tmax, H, HQ, D, D), b(lens, Tmax, H, HQ, D, D), st(B, S, H, HQ, D, D, seed),
        oa({B, S, HQ, D}, DType::bf16), la({B, S, HQ}, DType::f32), ob({B, S, HQ, D}, DType::bf16),
        lb({B, S, HQ}, DType::f32) {}
};

TEST(CudaDecode, ACallOfSTokensEqualsTheSameTokensOneByOne) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  for (int64_t S : {9, 64, 70}) {
    SCOPED_TRACE("S = " + std::to_string(S));
    TwoCaches c(S, 46 + S);
    SmallCache &at_once = c.a, &one_by_one = c.b;
    SmallStep& st = c.st;
    DevOut &oa = c.oa, &la = c.la, &ob = c.ob, &lb = c.lb;
    ASSERT_NO_THROW(pathattn::decode(st.in, at_once.view(), {oa.view, la.view, {}}, Backend::cuda));
    for (int64_t n = 0; n < S; ++n)
      ASSERT_NO_THROW(pathattn::decode(step_inputs(st.in, n, 1), one_by_one.view(),
                                       {rows(ob.view, n, 1), rows(lb.view, n, 1), {}}, Backend::cuda));
    TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(download<int32_t>(at_once.len), download<int32_t>(one_by_one.len));
    EXPECT_EQ(download<int32_t>(at_once.len), std::vector<double>({0.0 + S, 3.0 + S, 70.0 + S}));
    const std::vector<double> o = oa.to_vector();
    EXPECT_EQ(count_nonfinite(o), 0);
    expect_close("o", o, ob.to_vector(), tol::kBf16UnitRoundoff + tol::kCudaDecodeVsCpu);
    expect_close("lse", la.to_vector(), lb.to_vector(), tol::kCudaDecodeVsCpu);
    expect_close("cache.k", download<float>(at_once.k), download<float>(one_by_one.k), tol::kCudaDecodeVsCpu);
    EXPECT_EQ(download<float>(at_once.v), download<float>(one_by_one.v)) << "values are appended as given";
    expect_close("cache.gcum", download<double>(at_once.g), download<double>(one_by_one.g), tol::kCudaDecodeVsCpu);
  }
}

// commit = false (speculative decoding's verification) runs the chunked kernels without their writes: o and lse as
// a committing call's (to rounding: S = 1 commits through the single-step kernel), the cache, gates and lengths
// untouched, bit for bit. S = 1, 6, 64; lengths 0, 3 and 70. More than 64 tokens, or a checkpointed cache, is an Error.
TEST(CudaDecode, WithoutCommitTheSameOutputsAndTheCacheUntouched) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  for (int64_t S : {1, 6, 64}) {
    SCOPED_TRACE("S = " + std::to_string(S));
    TwoCaches c(S, 47 + S);
    SmallCache &tried = c.a, &committed = c.b;
    SmallStep& st = c.st;
    DevOut &oa = c.oa, &la = c.la, &ob = c.ob, &lb = c.lb;
    const std::vector<double> k0 = download<float>(tried.k), v0 = download<float>(tried.v),
                              g0 = download<double>(tried.g), l0 = download<int32_t>(tried.len);
    ASSERT_NO_THROW(pathattn::decode(st.in, tried.view(), {oa.view, la.view, {}}, Backend::cuda, false));
    ASSERT_NO_THROW(pathattn::decode(st.in, committed.view(), {ob.view, lb.view, {}}, Backend::cuda));
    TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(download<float>(tried.k), k0) << "cache.k";
    EXPECT_EQ(download<float>(tried.v), v0) << "cache.v";
    EXPECT_EQ(download<double>(tried.g), g0) << "cache.gcum";
    EXPECT_EQ(download<int32_t>(tried.len), l0) << "lengths";
    EXPECT_NE(download<float>(committed.k), k0) << "the committing call did carry the cache";
    EXPECT_EQ(count_nonfinite(oa.to_vector()), 0);
    expect_close("o", oa.to_vector(), ob.to_vector(), tol::kBf16UnitRoundoff + tol::kCudaDecodeVsCpu);
    expect_close("lse", la.to_vector(), lb.to_vector(), tol::kCudaDecodeVsCpu);
  }
  SmallCache dc({3}, 80, 1, 2, 64, 64);
  SmallStep st(1, 65, 1, 2, 64, 64, 48);
  DevOut o({1, 65, 2, 64}, DType::bf16), lse({1, 65, 2}, DType::f32);
  try {
    pathattn::decode(st.in, dc.view(), {o.view, lse.view, {}}, Backend::cuda, false);
    ADD_FAILURE() << "65 tokens without commit were accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(Mentions(e.what(), "commit = false takes at most 64 new tokens (one pass over the cache), got S = 65"));
  }
}

// No host work depends on the cache's lengths, so a decoding call can be captured in a CUDA graph (with a workspace
// from the caller, as torch's allocator gives it) and replayed: the replays equal the eager calls bit for bit. One
// token per call, and four (the chunked kernels by default).
class CudaDecodeGraph : public ::testing::TestWithParam<int64_t> {};
TEST_P(CudaDecodeGraph, ReplaysAsEagerCalls) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t H = 2, HQ = 8, D = 64, Tmax = 64, steps = 5, S = GetParam();
  const std::vector<int64_t> lens = {5, 30};
  SmallCache eager(lens, Tmax, H, HQ, D, D), graph(lens, Tmax, H, HQ, D, D);
  SmallStep st(2, S, H, HQ, D, D, 45);
  DevOut oe({2, S, HQ, D}, DType::bf16), le({2, S, HQ}, DType::f32), og({2, S, HQ, D}, DType::bf16),
      lg({2, S, HQ}, DType::f32);
  cudaStream_t stream;
  TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DevBuf scratch(64 << 20);
  Inputs in = st.in;
  in.cuda_stream = stream;
  in.cuda_workspace = [&](std::size_t n) -> void* { return n <= scratch.bytes ? scratch.data() : nullptr; };
  for (int64_t i = 0; i < steps; ++i)
    ASSERT_NO_THROW(pathattn::decode(in, eager.view(), {oe.view, le.view, {}}, Backend::cuda));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  ASSERT_NO_THROW(pathattn::decode(in, graph.view(), {og.view, lg.view, {}}, Backend::cuda));
  TEST_CUDA(cudaStreamEndCapture(stream, &g));
  TEST_CUDA(cudaGraphInstantiate(&ge, g, 0));
  for (int64_t i = 0; i < steps; ++i) TEST_CUDA(cudaGraphLaunch(ge, stream));
  TEST_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(download<int32_t>(graph.len), std::vector<double>({5.0 + steps * S, 30.0 + steps * S}));
  EXPECT_EQ(download<int32_t>(eager.len), download<int32_t>(graph.len));
  auto same = [](const std::vector<double>& a, const std::vector<double>& b) {  // bitwise, NaN rows included
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
    return true;
  };
  EXPECT_TRUE(same(download<float>(eager.k), download<float>(graph.k))) << "cache.k";
  EXPECT_TRUE(same(download<float>(eager.v), download<float>(graph.v))) << "cache.v";
  EXPECT_TRUE(same(download<double>(eager.g), download<double>(graph.g))) << "cache.gcum";
  EXPECT_TRUE(same(oe.to_vector(), og.to_vector())) << "o of the last step";
  EXPECT_TRUE(same(le.to_vector(), lg.to_vector())) << "lse of the last step";
  EXPECT_EQ(count_nonfinite(og.to_vector()), 0);
  TEST_CUDA(cudaGraphExecDestroy(ge));
  TEST_CUDA(cudaGraphDestroy(g));
  TEST_CUDA(cudaStreamDestroy(stream));
}
INSTANTIATE_TEST_SUITE_P(Tokens, CudaDecodeGraph, ::testing::Values(1, 4),
                         [](const auto& info) { return "S" + std::to_string(info.param); });

}  // namespace
}  // namespace pathattn::test
