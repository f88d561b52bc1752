// The fused short convolution of w (pathattn::short_conv_w, docs/math.md Eq. 44-46) on the CPU: against the
// definition written out directly, its gradients against central finite differences in f64, and the properties the
// layer relies on (a state continues a sequence exactly; cu_seqlens restarts it; the clamped norm's branch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "pathattn/pathattn.h"

namespace pathattn::test {
namespace {

struct ConvCase {
  int64_t B = 2, T = 9, H = 2, D = 5, K = 4;
  bool state = false;
  std::vector<int32_t> cu;  // packed batch (B = 1)
  double eps = 1e-12;
  double u_scale = 1.0;
};

struct ConvData {
  ConvCase c;
  std::vector<double> u, weight, state;
  int64_t C() const { return c.H * c.D; }
};

ConvData make_data(const ConvCase& c, uint64_t seed) {
  ConvData d{c, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  d.u.resize(static_cast<std::size_t>(c.B * c.T * c.H * c.D));
  for (double& x : d.u) x = c.u_scale * n01(rng);
  d.weight.resize(static_cast<std::size_t>(c.H * c.D * c.K));
  for (double& x : d.weight) x = 0.5 * n01(rng);
  if (c.state) {
    d.state.resize(static_cast<std::size_t>(c.B * (c.K - 1) * c.H * c.D));
    for (double& x : d.state) x = c.u_scale * n01(rng);
  }
  return d;
}

ShortConvW conv_inputs(ConvData& d, std::vector<int32_t>& cu) {
  const ConvCase& c = d.c;
  ShortConvW in;
  in.u = make_view(d.u.data(), DType::f64, {c.B, c.T, d.C()});
  in.weight = make_view(d.weight.data(), DType::f64, {d.C(), c.K});
  if (c.state) in.state = make_view(d.state.data(), DType::f64, {c.B, c.K - 1, d.C()});
  if (!cu.empty()) in.cu_seqlens = make_view(cu.data(), DType::i32, {static_cast<int64_t>(cu.size())});
  in.head_dim = c.D;
  in.eps = c.eps;
  return in;
}

// The definition (Eq. 44-45), written out independently of src/cpu/short_conv.cpp: x padded in front of each
// sequence by the state or zeros.
std::vector<double> definition(const ConvData& d) {
  const ConvCase& c = d.c;
  const int64_t C = d.C();
  std::vector<double> w(static_cast<std::size_t>(c.B * c.T * C));
  for (int64_t b = 0; b < c.B; ++b) {
    std::vector<int64_t> starts = {0};
    if (!c.cu.empty()) starts.assign(c.cu.begin(), c.cu.end() - 1);
    for (int64_t t = 0; t < c.T; ++t) {
      int64_t start = 0;
      for (int64_t s : starts)
        if (s <= t) start = s;
      std::vector<double> a(static_cast<std::size_t>(C));
      for (int64_t ch = 0; ch < C; ++ch) {
        double y = 0.0;
        for (int64_t j = 0; j < c.K; ++j) {
          const int64_t s = t - (c.K - 1) + j;
          double x = 0.0;
          if (s >= start) x = d.u[static_cast<std::size_t>((b * c.T + s) * C + ch)];
          else if (c.state && s < 0) x = d.state[static_cast<std::size_t>((b * (c.K - 1) + (c.K - 1 + s)) * C + ch)];
          y += d.weight[static_cast<std::size_t>(ch * c.K + j)] * x;
        }
        a[static_cast<std::size_t>(ch)] = y / (1.0 + std::exp(-y));
      }
      for (int64_t h = 0; h < c.H; ++h) {
        double ss = 0.0;
        for (int64_t e = 0; e < c.D; ++e) ss += a[static_cast<std::size_t>(h * c.D + e)] * a[static_cast<std::size_t>(h * c.D + e)];
        const double n = std::max(std::sqrt(ss), c.eps);
        for (int64_t e = 0; e < c.D; ++e)
          w[static_cast<std::size_t>((b * c.T + t) * C + h * c.D + e)] = a[static_cast<std::size_t>(h * c.D + e)] / n;
      }
    }
  }
  return w;
}

std::vector<double> run_forward(ConvData& d) {
  std::vector<int32_t> cu = d.c.cu;
  std::vector<double> w(static_cast<std::size_t>(d.c.B * d.c.T * d.C()), std::nan(""));
  short_conv_w(conv_inputs(d, cu), make_view(w.data(), DType::f64, {d.c.B, d.c.T, d.c.H, d.c.D}));
  return w;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::string name_of(const ConvCase& c) {
  return "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" + std::to_string(c.H) + " D" +
         std::to_string(c.D) + " K" + std::to_string(c.K) + (c.state ? " state" : "") +
         (c.cu.empty() ? "" : " varlen") + " eps" + std::to_string(c.eps);
}

std::vector<ConvCase> cases() {
  std::vector<ConvCase> v;
  v.push_back({});
  v.push_back({1, 1, 1, 4, 3, false, {}, 1e-12, 1.0});            // T = 1
  v.push_back({2, 7, 3, 4, 1, false, {}, 1e-12, 1.0});            // K = 1: no convolution, SiLU + norm only
  v.push_back({2, 6, 2, 3, 4, true, {}, 1e-12, 1.0});             // a state before row 0
  v.push_back({1, 9, 2, 4, 3, false, {0, 1, 1, 5, 6, 9}, 1e-12, 1.0});  // varlen, length-1 and empty sequences
  v.push_back({1, 8, 2, 4, 3, false, {}, 0.5, 0.05});             // every norm below eps: the clamped branch
  v.push_back({2, 5, 1, 2, 2, true, {}, 1e-12, 1.0});             // D = 2, K - 1 = 1 state row
  return v;
}

TEST(ShortConv, ForwardEqualsTheDefinition) {
  for (const ConvCase& c : cases()) {
    ConvData d = make_data(c, 7);
    const auto got = run_forward(d), want = definition(d);
    EXPECT_LT(max_abs_diff(got, want), 1e-13) << name_of(c);
  }
}

// L = sum(w * R) for a fixed random R; its gradients from the backward against central differences of the forward.
TEST(ShortConv, GradientsEqualFiniteDifferences) {
  for (const ConvCase& c : cases()) {
    ConvData d = make_data(c, 11);
    const int64_t C = d.C(), K = c.K;
    std::vector<double> R(static_cast<std::size_t>(c.B * c.T * C));
    std::mt19937_64 rng(3);
    std::normal_distribution<double> n01(0.0, 1.0);
    for (double& x : R) x = n01(rng);
    auto loss = [&] {
      const auto w = run_forward(d);
      double s = 0.0;
      for (std::size_t i = 0; i < w.size(); ++i) s += w[i] * R[i];
      return s;
    };
    std::vector<int32_t> cu = c.cu;
    std::vector<double> du(d.u.size(), std::nan("")), dweight(d.weight.size(), std::nan("")),
        dstate(d.state.size(), std::nan(""));
    short_conv_w_backward(conv_inputs(d, cu), make_view(R.data(), DType::f64, {c.B, c.T, c.H, c.D}),
                          make_view(du.data(), DType::f64, {c.B, c.T, C}), make_view(dweight.data(), DType::f64, {C, K}),
                          c.state ? make_view(dstate.data(), DType::f64, {c.B, K - 1, C}) : TensorView());
    auto check = [&](std::vector<double>& x, const std::vector<double>& g, const char* what) {
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double h = 1e-6 * std::max(1.0, std::fabs(x[i])), x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss();
        x[i] = x0 - h;
        const double lm = loss();
        x[i] = x0;
        const double fd = (lp - lm) / (2 * h);
        EXPECT_NEAR(g[i], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << what << "[" << i << "] " << name_of(c);
      }
    };
    check(d.u, du, "du");
    check(d.weight, dweight, "dweight");
    if (c.state) check(d.state, dstate, "dstate");
  }
}

// Decoding's contract: the convolution over [prefix; rest] equals the one over rest with state = the prefix's last
// K - 1 inputs, row for row (the same arithmetic, so the same bits).
TEST(ShortConv, AStateContinuesTheSequence) {
  ConvCase whole{2, 11, 2, 4, 4, false, {}, 1e-12, 1.0};
  ConvData d = make_data(whole, 5);
  const auto w_all = run_forward(d);
  const int64_t P = 6, C = d.C(), K = whole.K;
  ConvCase rest = whole;
  rest.T = whole.T - P;
  rest.state = true;
  ConvData r{rest, {}, d.weight, {}};
  for (int64_t b = 0; b < whole.B; ++b) {
    for (int64_t t = P; t < whole.T; ++t)
      for (int64_t ch = 0; ch < C; ++ch) r.u.push_back(d.u[static_cast<std::size_t>((b * whole.T + t) * C + ch)]);
  }
  for (int64_t b = 0; b < whole.B; ++b)
    for (int64_t t = P - (K - 1); t < P; ++t)
      for (int64_t ch = 0; ch < C; ++ch) r.state.push_back(d.u[static_cast<std::size_t>((b * whole.T + t) * C + ch)]);
  const auto w_rest = run_forward(r);
  for (int64_t b = 0; b < whole.B; ++b)
    for (int64_t t = P; t < whole.T; ++t)
      for (int64_t ch = 0; ch < C; ++ch)
        ASSERT_EQ(w_rest[static_cast<std::size_t>((b * rest.T + t - P) * C + ch)],
                  w_all[static_cast<std::size_t>((b * whole.T + t) * C + ch)])
            << "b " << b << " t " << t << " c " << ch;
}

// float32 views give the float64 result to float32 rounding (the CPU computes in double either way).
TEST(ShortConv, Float32MatchesFloat64) {
  ConvCase c{2, 13, 2, 8, 3, true, {}, 1e-12, 1.0};
  ConvData d = make_data(c, 9);
  const auto w64 = run_forward(d);
  std::vector<float> u(d.u.begin(), d.u.end()), wt(d.weight.begin(), d.weight.end()), st(d.state.begin(), d.state.end());
  for (std::size_t i = 0; i < u.size(); ++i) d.u[i] = u[i];  // the f64 reference of the rounded inputs
  for (std::size_t i = 0; i < wt.size(); ++i) d.weight[i] = wt[i];
  for (std::size_t i = 0; i < st.size(); ++i) d.state[i] = st[i];
  const auto ref = run_forward(d);
  ShortConvW in;
  in.u = make_view(u.data(), DType::f32, {c.B, c.T, d.C()});
  in.weight = make_view(wt.data(), DType::f32, {d.C(), c.K});
  in.state = make_view(st.data(), DType::f32, {c.B, c.K - 1, d.C()});
  in.head_dim = c.D;
  std::vector<float> w(ref.size());
  short_conv_w(in, make_view(w.data(), DType::f32, {c.B, c.T, c.H, c.D}));
  for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], ref[i], 1e-7) << i;
  (void)w64;
}

// No rows: w is empty, dweight all zeros, dstate zeros (nothing reads the state). make_view's strides of a [2, 0, ...]
// view are 0, which must not read as a broadcast output.
TEST(ShortConv, EmptySequencesGiveZeroGradients) {
  ConvCase c{2, 0, 2, 4, 3, true, {}, 1e-12, 1.0};
  ConvData d = make_data(c, 2);
  std::vector<int32_t> cu;
  std::vector<double> none(1), dweight(d.weight.size(), std::nan("")), dstate(d.state.size(), std::nan(""));
  const ShortConvW in = conv_inputs(d, cu);
  short_conv_w(in, make_view(none.data(), DType::f64, {2, 0, 2, 4}));
  short_conv_w_backward(in, make_view(none.data(), DType::f64, {2, 0, 2, 4}), make_view(none.data(), DType::f64, {2, 0, 8}),
                        make_view(dweight.data(), DType::f64, {8, 3}), make_view(dstate.data(), DType::f64, {2, 2, 8}));
  for (double x : dweight) EXPECT_EQ(x, 0.0);
  for (double x : dstate) EXPECT_EQ(x, 0.0);
}

TEST(ShortConv, BadInputNamesTheArgument) {
  ConvCase c;
  ConvData d = make_data(c, 1);
  std::vector<int32_t> cu;
  std::vector<double> w(d.u.size()), du(d.u.size()), dweight(d.weight.size());
  const TensorView wv = make_view(w.data(), DType::f64, {c.B, c.T, c.H, c.D});
  auto expect_error = [&](ShortConvW in, const TensorView& out, const std::string& needle) {
    try {
      short_conv_w(in, out);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ShortConvW in = conv_inputs(d, cu);
  ShortConvW bad = in;
  bad.head_dim = 3;  // C = 10
  expect_error(bad, wv, "head_dim must be a positive divisor");
  bad = in;
  bad.weight = make_view(d.weight.data(), DType::f64, {d.C() - 1, c.K});
  expect_error(bad, wv, "weight must have shape [C, K]");
  bad = in;
  bad.eps = 0;
  expect_error(bad, wv, "eps must be a finite positive number");
  bad = in;
  bad.u = make_view(d.u.data(), DType::f64, {c.B, c.T * d.C()});
  expect_error(bad, wv, "u must have 3 dimensions");
  bad = in;
  bad.state = make_view(d.u.data(), DType::f64, {c.B, c.K, d.C()});
  expect_error(bad, wv, "state must have shape [B, K - 1, C]");
  std::vector<int32_t> bad_cu = {0, 4, 3, 9};
  ConvCase one = c;
  one.B = 1;
  ConvData d1 = make_data(one, 1);
  ShortConvW v = conv_inputs(d1, cu);
  v.cu_seqlens = make_view(bad_cu.data(), DType::i32, {4});
  expect_error(v, make_view(w.data(), DType::f64, {1, c.T, c.H, c.D}), "cu_seqlens must be non-decreasing");
  bad_cu = {0, 4, 8};
  v.cu_seqlens = make_view(bad_cu.data(), DType::i32, {3});
  expect_error(v, make_view(w.data(), DType::f64, {1, c.T, c.H, c.D}), "cu_seqlens[-1] must equal the packed length");
  expect_error(in, make_view(w.data(), DType::f32, {c.B, c.T, c.H, c.D}), "w (output) must have dtype float64");
  expect_error(in, make_view(w.data(), DType::f64, {c.B, c.T, c.D, c.H}), "w (output) must have shape");
  expect_error(in, make_view(d.u.data(), DType::f64, {c.B, c.T, c.H, c.D}), "w (output) shares memory with u");
  try {
    short_conv_w_backward(in, wv, make_view(du.data(), DType::f64, {c.B, c.T, d.C()}),
                          make_view(dweight.data(), DType::f64, {d.C(), c.K}),
                          make_view(dweight.data(), DType::f64, {c.B, c.K - 1, d.C()}));
    ADD_FAILURE() << "dstate without state was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dstate was given but state was not"), std::string::npos) << e.what();
  }
}

// The CUDA limits are argument errors, raised before any device work (so they are checked here without a GPU): a
// view that claims to be on CUDA with head_dim > 256, K > 8, or float64.
TEST(ShortConv, CudaLimitsAreNamedErrors) {
  float dummy[1] = {0.f};
  auto cuda_view = [&](DType dt, std::initializer_list<int64_t> sizes) {
    TensorView v = make_view(dummy, dt, sizes, Device::cuda, 0);
    return v;
  };
  auto expect_error = [](const ShortConvW& in, const TensorView& w, const std::string& needle) {
    try {
      short_conv_w(in, w);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ShortConvW in;
  in.u = cuda_view(DType::bf16, {1, 4, 512});
  in.weight = cuda_view(DType::f32, {512, 4});
  in.head_dim = 512;
  expect_error(in, cuda_view(DType::f32, {1, 4, 1, 512}), "head_dim must be at most 256 on CUDA");
  in.head_dim = 64;
  in.weight = cuda_view(DType::f32, {512, 9});
  expect_error(in, cuda_view(DType::f32, {1, 4, 8, 64}), "kernel size K must be at most 8 on CUDA");
  in.u = cuda_view(DType::f64, {1, 4, 512});
  in.weight = cuda_view(DType::f64, {512, 4});
  expect_error(in, cuda_view(DType::f64, {1, 4, 8, 64}), "u must have dtype float32 or bfloat16 or float16");
}

}  // namespace
}  // namespace pathattn::test
