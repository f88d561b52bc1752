// The fused RoPE rotation (pathattn::rope_rotate) on the CPU: against the definition in f64 and in f32 (each product
// rounded before the sum: the same bits), the inverse as the transpose (the rotation's backward), strided rows, and
// clear errors for bad arguments. The bit-for-bit check against the ATen composition it replaces is in
// tests/model/test_model_attention.cpp (CPU) and tests/model/test_model_cuda.cpp (CUDA).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "pathattn/pathattn.h"

namespace pathattn::test {
namespace {

constexpr int64_t B = 2, T = 5, H = 3, D = 8, half = D / 2;

template <typename F>
struct Tables {
  std::vector<F> cos, sin;
  Tables() : cos(T * half), sin(T * half) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < half; ++j) {
        const double ang = static_cast<double>(t) * std::pow(10000.0, -static_cast<double>(j) / half);
        cos[t * half + j] = static_cast<F>(std::cos(ang));
        sin[t * half + j] = static_cast<F>(std::sin(ang));
      }
  }
};

template <typename F>
std::vector<F> random_x(uint64_t seed, int64_t n) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::vector<F> x(n);
  for (F& v : x) v = static_cast<F>(n01(rng));
  return x;
}

template <typename F>
constexpr DType dtype_of() {
  return sizeof(F) == 8 ? DType::f64 : DType::f32;
}

template <typename F>
std::vector<F> rotate(const std::vector<F>& x, Tables<F>& tab, bool inverse) {
  std::vector<F> y(x.size());
  RopeRotate in;
  in.x = make_view(const_cast<F*>(x.data()), dtype_of<F>(), {B, T, H, D});
  in.cos = make_view(tab.cos.data(), dtype_of<F>(), {T, half});
  in.sin = make_view(tab.sin.data(), dtype_of<F>(), {T, half});
  in.inverse = inverse;
  rope_rotate(in, make_view(y.data(), dtype_of<F>(), {B, T, H, D}));
  return y;
}

// The definition, each product rounded to F before the sum (volatile: no contraction into a fused multiply-add).
template <typename F>
F rounded_sum(F p, F q, bool minus) {
  volatile F a = p, b = q;
  volatile F r = minus ? a - b : a + b;
  return r;
}

template <typename F>
void expect_definition(bool inverse) {
  Tables<F> tab;
  const auto x = random_x<F>(3, B * T * H * D);
  const auto y = rotate(x, tab, inverse);
  for (int64_t r = 0; r < B * T * H; ++r) {
    const int64_t t = (r / H) % T;
    for (int64_t j = 0; j < half; ++j) {
      const F x1 = x[r * D + j], x2 = x[r * D + half + j], c = tab.cos[t * half + j], s = tab.sin[t * half + j];
      volatile F a = x1 * c, bs = x2 * s, e = x1 * s, f = x2 * c;
      const F y1 = inverse ? rounded_sum<F>(a, bs, false) : rounded_sum<F>(a, bs, true);
      const F y2 = inverse ? rounded_sum<F>(f, e, true) : rounded_sum<F>(e, f, false);
      ASSERT_EQ(y[r * D + j], y1) << "row " << r << " j " << j;
      ASSERT_EQ(y[r * D + half + j], y2) << "row " << r << " j " << j;
    }
  }
}

TEST(RopeRotate, EqualsTheDefinitionBitForBitInF32AndF64) {
  expect_definition<float>(false);
  expect_definition<float>(true);
  expect_definition<double>(false);
  expect_definition<double>(true);
}

TEST(RopeRotate, InverseUndoesTheRotationAndIsItsTranspose) {
  Tables<double> tab;
  const auto x = random_x<double>(5, B * T * H * D), g = random_x<double>(6, B * T * H * D);
  const auto back = rotate(rotate(x, tab, false), tab, true);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-12) << i;
  // <R x, g> == <x, R^T g>: the inverse is the backward of the rotation.
  const auto rx = rotate(x, tab, false), rtg = rotate(g, tab, true);
  double lhs = 0, rhs = 0;
  for (std::size_t i = 0; i < x.size(); ++i) lhs += rx[i] * g[i], rhs += x[i] * rtg[i];
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::abs(lhs) + 1e-12);
}

TEST(RopeRotate, TakesStridedRows) {
  // x as every other head of a [B, T, 2H, D] buffer: the same result as the contiguous copy.
  Tables<float> tab;
  const auto wide = random_x<float>(7, B * T * 2 * H * D);
  std::vector<float> x(B * T * H * D);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) x[(bt * H + h) * D + d] = wide[(bt * 2 * H + 2 * h) * D + d];
  RopeRotate in;
  in.x = make_view(const_cast<float*>(wide.data()), DType::f32, {B, T, H, D});
  in.x.strides[2] = 2 * D, in.x.strides[1] = 2 * H * D, in.x.strides[0] = T * 2 * H * D;
  in.cos = make_view(tab.cos.data(), DType::f32, {T, half});
  in.sin = make_view(tab.sin.data(), DType::f32, {T, half});
  std::vector<float> y(B * T * H * D);
  rope_rotate(in, make_view(y.data(), DType::f32, {B, T, H, D}));
  EXPECT_EQ(y, rotate(x, tab, false));
}

TEST(RopeRotate, BadArgumentsNameTheArgument) {
  Tables<float> tab;
  std::vector<float> x(B * T * H * D), y(x.size()), odd(B * T * H * 7);
  auto call = [&](RopeRotate in, TensorView out) {
    try {
      rope_rotate(in, out);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  RopeRotate ok;
  ok.x = make_view(x.data(), DType::f32, {B, T, H, D});
  ok.cos = make_view(tab.cos.data(), DType::f32, {T, half});
  ok.sin = make_view(tab.sin.data(), DType::f32, {T, half});
  const TensorView out = make_view(y.data(), DType::f32, {B, T, H, D});
  EXPECT_EQ(call(ok, out), "");
  RopeRotate r = ok;
  r.x = make_view(odd.data(), DType::f32, {B, T, H, 7});
  EXPECT_NE(call(r, make_view(odd.data(), DType::f32, {B, T, H, 7})).find("must be even"), std::string::npos);
  r = ok;
  r.cos = make_view(tab.cos.data(), DType::f32, {T - 1, half});
  EXPECT_NE(call(r, out).find("cos"), std::string::npos);
  r = ok;
  r.sin = make_view(tab.sin.data(), DType::f64, {T, half});
  EXPECT_NE(call(r, out).find("sin"), std::string::npos);
  r = ok;
  r.x.strides[3] = 2;
  EXPECT_NE(call(r, out).find("x.stride(3)"), std::string::npos);
  EXPECT_NE(call(ok, ok.x).find("out"), std::string::npos) << "out overlapping x";
  r = ok;
  r.x.dtype = DType::bf16;
  EXPECT_NE(call(r, out).find("x"), std::string::npos) << "bf16 on the CPU";
  EXPECT_NE(call(ok, make_view(y.data(), DType::f32, {B, T, H, D - 2})).find("out"), std::string::npos);
}

}  // namespace
}  // namespace pathattn::test
