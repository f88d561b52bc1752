// The fused short convolution of w on CUDA (src/cuda/kernels/short_conv.cuh) against the CPU core in float64 on
// the same (rounded) inputs: w, du, dweight and dstate over head dims 8..256, kernel sizes 1..8, 16-bit and f32
// inputs, strided u, a state, a packed batch with length-1 sequences, T not a multiple of the 64-row tile, T = 0;
// untouched guard bands; two backward calls give the same bits. The cases the vector form takes (D a power of 2 from
// 8 to 256, K <= 4, no state, contiguous u) run on it by default and on the row kernels with PATHATTN_SHORT_CONV=rows
// (tools/gpu_check.sh runs both).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_buffers.h"
#include "pathattn/pathattn.h"

namespace pathattn::test {
namespace {

struct Case {
  int64_t B, T, H, D, K;
  DType u_dt;
  bool weight_f32 = true;
  bool state = false;
  bool permuted = false;       // u stored [B, C, T]
  std::vector<int32_t> seqlens;  // packed batch (B = 1)
  std::string name() const {
    std::string s = "B" + std::to_string(B) + "_T" + std::to_string(T) + "_H" + std::to_string(H) + "_D" +
                    std::to_string(D) + "_K" + std::to_string(K) + "_" + dtype_name(u_dt);
    if (!weight_f32) s += "_wlowp";
    if (state) s += "_state";
    if (permuted) s += "_permuted";
    if (!seqlens.empty()) s += "_varlen" + std::to_string(seqlens.size());
    return s;
  }
};

double round_to(double x, DType dt) {
  if (dt == DType::f32) return static_cast<float>(x);
  return from_lowp(to_lowp(x, dt), dt);
}

// Elementwise |got - want| <= rel |want| + floor max|want|, the first violation reported.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel, double floor,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 0.0;
  for (double x : want) mx = std::max(mx, std::fabs(x));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + floor * mx)) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i] << " (max |want| " << mx << ")";
      return;
    }
}

double ulp_rel(DType dt) { return dt == DType::bf16 ? 0x1p-7 : dt == DType::f16 ? 0x1p-10 : 1e-5; }

void run_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name());
  const int64_t C = c.H * c.D, K = c.K;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  auto draw = [&](std::size_t n, double scale, DType dt) {
    std::vector<double> v(n);
    for (double& x : v) x = round_to(scale * n01(rng), dt);
    return v;
  };
  const DType wt_dt = c.weight_f32 ? DType::f32 : c.u_dt;
  std::vector<double> u = draw(static_cast<std::size_t>(c.B * c.T * C), 1.0, c.u_dt);
  std::vector<double> weight = draw(static_cast<std::size_t>(C * K), 0.5, wt_dt);
  std::vector<double> state = c.state ? draw(static_cast<std::size_t>(c.B * (K - 1) * C), 1.0, c.u_dt) : std::vector<double>();
  std::vector<double> dw = draw(static_cast<std::size_t>(c.B * c.T * C), 1.0, DType::f32);
  std::vector<int32_t> cu;
  if (!c.seqlens.empty()) {
    cu.push_back(0);
    for (int32_t l : c.seqlens) cu.push_back(cu.back() + l);
  }

  // The CPU core in float64 on the same values.
  ShortConvW ref;
  ref.u = make_view(u.data(), DType::f64, {c.B, c.T, C});
  ref.weight = make_view(weight.data(), DType::f64, {C, K});
  if (c.state) ref.state = make_view(state.data(), DType::f64, {c.B, K - 1, C});
  if (!cu.empty()) ref.cu_seqlens = make_view(cu.data(), DType::i32, {static_cast<int64_t>(cu.size())});
  ref.head_dim = c.D;
  std::vector<double> w_ref(u.size()), du_ref(u.size()), dwt_ref(weight.size()), ds_ref(state.size());
  short_conv_w(ref, make_view(w_ref.data(), DType::f64, {c.B, c.T, c.H, c.D}));
  short_conv_w_backward(ref, make_view(dw.data(), DType::f64, {c.B, c.T, c.H, c.D}),
                        make_view(du_ref.data(), DType::f64, {c.B, c.T, C}), make_view(dwt_ref.data(), DType::f64, {C, K}),
                        c.state ? make_view(ds_ref.data(), DType::f64, {c.B, K - 1, C}) : TensorView());

  DevTensor u_d(u, {c.B, c.T, C}, c.u_dt, c.permuted);
  DevTensor wt_d(weight, {C, K}, wt_dt, false);
  DevTensor dw_d(dw, {c.B, c.T, c.H, c.D}, DType::f32, false);
  std::vector<double> cu_dbl(cu.begin(), cu.end());
  DevTensor cu_d(cu.empty() ? std::vector<double>{0} : cu_dbl, {cu.empty() ? 1 : static_cast<int64_t>(cu.size())},
                 DType::i32, false);
  DevTensor st_d(c.state ? state : std::vector<double>{0}, {c.state ? c.B : 1, c.state ? K - 1 : 1, c.state ? C : 1},
                 c.u_dt, false);
  ShortConvW in;
  in.u = u_d.view;
  in.weight = wt_d.view;
  if (c.state) in.state = st_d.view;
  if (!cu.empty()) in.cu_seqlens = cu_d.view;
  in.head_dim = c.D;
  DevOut w({c.B, c.T, c.H, c.D}, DType::f32);
  short_conv_w(in, w.view);
  DevOut du({c.B, c.T, C}, c.u_dt), dwt({C, K}, DType::f32);
  DevOut ds({c.state ? c.B : 1, c.state ? K - 1 : 1, C}, c.u_dt);
  short_conv_w_backward(in, dw_d.view, du.view, dwt.view, c.state ? ds.view : TensorView());
  TEST_CUDA(cudaDeviceSynchronize());

  expect_close(w.to_vector(), w_ref, 0, 2e-6 * std::sqrt(static_cast<double>(c.D)) + 1e-6, "w");
  expect_close(du.to_vector(), du_ref, ulp_rel(c.u_dt), 2e-5, "du");
  expect_close(dwt.to_vector(), dwt_ref, 0, 1e-4, "dweight");
  if (c.state) expect_close(ds.to_vector(), ds_ref, ulp_rel(c.u_dt), 2e-5, "dstate");
  for (const DevBuf* b : {&w.buf, &du.buf, &dwt.buf, &ds.buf}) EXPECT_TRUE(b->guards_intact());

  // The same bits again (the weight partials are added in one fixed order).
  DevOut du2({c.B, c.T, C}, c.u_dt), dwt2({C, K}, DType::f32);
  short_conv_w_backward(in, dw_d.view, du2.view, dwt2.view);
  TEST_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(du2.buf.download<char>(), du.buf.download<char>());
  EXPECT_EQ(dwt2.buf.download<char>(), dwt.buf.download<char>());
}

class CudaShortConv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaShortConv, MatchesTheCpuCore) {
  const std::vector<Case> cases = {
      {2, 130, 3, 64, 4, DType::bf16},
      {1, 1, 2, 64, 4, DType::bf16},                      // T = 1
      {3, 64, 2, 128, 3, DType::f16},                     // exactly one tile
      {2, 200, 2, 16, 8, DType::f32},                     // D = 16, K = 8
      {1, 97, 1, 256, 4, DType::bf16, false},             // D = 256, weight in u's dtype
      {2, 70, 2, 96, 1, DType::bf16},                     // D = 96 (3 channels per lane), K = 1
      {2, 66, 2, 64, 4, DType::bf16, true, true},         // a state, its gradient
      {2, 5, 1, 32, 8, DType::f16, true, true},           // T < K - 1 with a state
      {2, 150, 2, 64, 4, DType::bf16, true, false, true}, // strided u
      {1, 160, 2, 64, 4, DType::bf16, true, false, false, {1, 64, 1, 30, 1, 63}},  // varlen, length-1 sequences
      {2, 1000, 4, 64, 4, DType::bf16},
      {2, 77, 3, 32, 2, DType::f32},                      // f32 u, D = 32, K = 2 (the vector form's f32 loads)
      {1, 300, 4, 8, 3, DType::f16, false},               // D = 8: one lane per head in the vector form
      {1, 400, 2, 128, 4, DType::bf16, true, false, false, {129, 1, 127, 143}},  // varlen across 128-row CTAs
  };
  uint64_t seed = 1;
  for (const Case& c : cases) run_case(c, seed++);
}

TEST_F(CudaShortConv, EmptySequenceGivesZeroWeightGradient) {
  std::vector<double> weight(2 * 64 * 4, 0.25);
  DevTensor wt_d(weight, {128, 4}, DType::f32, false);
  DevBuf u(16);
  ShortConvW in;
  in.u = make_view(u.data(), DType::bf16, {2, 0, 128}, Device::cuda);
  in.weight = wt_d.view;
  in.head_dim = 64;
  DevOut w({2, 0, 2, 64}, DType::f32), dw({2, 0, 2, 64}, DType::f32), du({2, 0, 128}, DType::bf16);
  DevOut dwt({128, 4}, DType::f32);
  short_conv_w(in, w.view);
  short_conv_w_backward(in, dw.view, du.view, dwt.view);
  TEST_CUDA(cudaDeviceSynchronize());
  for (double x : dwt.to_vector()) ASSERT_EQ(x, 0.0);
}

}  // namespace
}  // namespace pathattn::test
