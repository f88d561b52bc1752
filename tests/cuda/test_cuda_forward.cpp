// The CUDA forward (o, lse, kcache) against the f64 reference across the core case list, with FlashAttention's
// tolerance rule (lowp_baseline.h). Outputs are poisoned with NaN before each run and lie between guard bands,
// so an element left unwritten or a stray write fails the test. Label gpu: run by tools/gpu_check.sh.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "lowp_baseline.h"
#include "tolerances.h"

namespace pathattn::test {
namespace {

#define TEST_CUDA(call)                                                                          \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_) << " at " << __FILE__ \
                               << ":" << __LINE__;                                               \
  } while (0)

struct GpuSpec {
  Spec s;
  DType dt = DType::bf16;
  bool w_lowp = false;    // pass w in bf16 instead of f32
  bool w_padded = false;  // w rows padded by one element: strides that rule out 16-byte loads (scalar path)
  std::string name() const {
    return s.name() + (dt == DType::bf16 ? "_bf16" : "_f16") + (w_lowp ? "_wbf16" : "") + (w_padded ? "_wpad" : "");
  }
};

uint16_t to_lowp(double x, DType dt) {
  uint16_t u;
  if (dt == DType::bf16) {
    __nv_bfloat16 b = __float2bfloat16_rn(static_cast<float>(x));
    std::memcpy(&u, &b, 2);
  } else {
    __half h = __float2half_rn(static_cast<float>(x));
    std::memcpy(&u, &h, 2);
  }
  return u;
}
double from_lowp(uint16_t u, DType dt) {
  if (dt == DType::bf16) {
    __nv_bfloat16 b;
    std::memcpy(&b, &u, 2);
    return __bfloat162float(b);
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

// A device buffer with guard bands of a fixed byte pattern on both sides; the body starts as NaN (0xFF bytes).
struct DevBuf {
  static constexpr size_t kGuard = 256;
  char* base = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    if (cudaMalloc(&base, n + 2 * kGuard) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    cudaMemset(base, 0xA5, kGuard);
    cudaMemset(base + kGuard, 0xFF, n);
    cudaMemset(base + kGuard + n, 0xA5, kGuard);
  }
  ~DevBuf() { cudaFree(base); }
  void* data() const { return base + kGuard; }
  void upload(const void* src) { cudaMemcpy(data(), src, bytes, cudaMemcpyHostToDevice); }
  template <typename X>
  std::vector<X> download() const {
    std::vector<X> h(bytes / sizeof(X));
    cudaMemcpy(h.data(), data(), bytes, cudaMemcpyDeviceToHost);
    return h;
  }
  bool guards_intact() const {
    std::vector<unsigned char> g(kGuard);
    for (size_t at : {size_t(0), kGuard + bytes}) {
      cudaMemcpy(g.data(), base + at, kGuard, cudaMemcpyDeviceToHost);
      for (unsigned char c : g)
        if (c != 0xA5) return false;
    }
    return true;
  }
};

// A [B, T, X, Y] tensor uploaded to the device, stored [B, X, T, Y] when permuted (a strided view), each
// row of Y stored with `pad` unused elements after it.
struct DevTensor {
  DevBuf buf;
  TensorView view;
  DevTensor(const std::vector<double>& src, std::vector<int64_t> sizes, DType dt, bool permuted, int64_t pad = 0)
      : buf(static_cast<size_t>(src.size() / sizes.back() * (sizes.back() + pad)) * dtype_size(dt)) {
    const int nd = static_cast<int>(sizes.size());
    std::vector<int64_t> store = sizes, st(nd);
    store[nd - 1] += pad;
    if (permuted && nd >= 3) std::swap(store[1], store[2]);
    int64_t stride = 1;
    for (int d = nd - 1; d >= 0; --d) {
      st[d] = stride;
      stride *= store[d];
    }
    if (permuted && nd >= 3) std::swap(st[1], st[2]);
    view.data = buf.data();
    view.dtype = dt;
    view.device = Device::cuda;
    view.ndim = nd;
    for (int d = 0; d < nd; ++d) {
      view.sizes[d] = sizes[d];
      view.strides[d] = st[d];
    }
    // Scatter in logical row-major order to the (possibly permuted) offsets.
    std::vector<char> host(buf.bytes);
    int64_t idx[4] = {0, 0, 0, 0};
    for (size_t lin = 0; lin < src.size(); ++lin) {
      int64_t r = static_cast<int64_t>(lin), off = 0;
      for (int d = nd - 1; d >= 0; --d) {
        idx[d] = r % sizes[d];
        r /= sizes[d];
        off += idx[d] * st[d];
      }
      if (dt == DType::f32) {
        const float f = static_cast<float>(src[lin]);
        std::memcpy(&host[off * 4], &f, 4);
      } else {
        const uint16_t u = to_lowp(src[lin], dt);
        std::memcpy(&host[off * 2], &u, 2);
      }
    }
    buf.upload(host.data());
  }
};

// An output tensor, contiguous, poisoned.
struct DevOut {
  DevBuf buf;
  TensorView view;
  DType dt;
  DevOut(std::initializer_list<int64_t> sizes, DType d) : buf(count(sizes) * dtype_size(d)), dt(d) {
    view = make_view(buf.data(), d, sizes, Device::cuda, 0);
  }
  static size_t count(std::initializer_list<int64_t> s) {
    size_t n = 1;
    for (int64_t x : s) n *= static_cast<size_t>(x);
    return n;
  }
  std::vector<double> to_vector() const {
    std::vector<double> out;
    if (dt == DType::f32) {
      for (float f : buf.download<float>()) out.push_back(f);
    } else {
      for (uint16_t u : buf.download<uint16_t>()) out.push_back(from_lowp(u, dt));
    }
    return out;
  }
};

int64_t count_nonfinite(const std::vector<double>& x) {
  int64_t n = 0;
  for (double e : x) n += !std::isfinite(e);
  return n;
}

// The error of `got` against the f64 reference must be within factor x the baseline's error plus abs.
void expect_within(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                   const std::vector<double>& base) {
  const double e_base = rel_err(base, ref), e_got = rel_err(got, ref);
  const double ratio = bound_ratio(got, ref, tol::kLowPrecisionFactor * e_base, tol::kLowPrecisionAbs);
  EXPECT_LE(ratio, 1.0) << what << ": relative error " << e_got << " vs low-precision baseline " << e_base
                        << " (max abs " << max_abs_err(got, ref) << ")";
  std::printf("  %-7s rel err %.3e  baseline %.3e  (ratio to bound %.3f)\n", what, e_got, e_base, ratio);
}

class CudaForward : public ::testing::TestWithParam<GpuSpec> {};

TEST_P(CudaForward, MatchesReference) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) GTEST_SKIP() << "no CUDA device";
  const GpuSpec gs = GetParam();
  const Spec& s = gs.s;
  Problem64 P(s);

  // f64 reference (o, lse, kcache) and the low-precision baseline.
  Case<double> r(P);
  r.forward(Backend::reference, true);
  const LowpResult base = lowp_forward(P, gs.dt, gs.w_lowp);

  DevTensor q(P.q, {s.B, s.T, s.HQ, s.D}, gs.dt, s.permuted);
  DevTensor k(P.k, {s.B, s.T, s.H, s.D}, gs.dt, s.permuted);
  DevTensor v(P.v, {s.B, s.T, s.H, s.DV}, gs.dt, s.permuted);
  DevTensor w(P.w, {s.B, s.T, s.H, s.D}, gs.w_lowp ? DType::bf16 : DType::f32, s.permuted, gs.w_padded ? 1 : 0);
  DevTensor beta(P.beta, {s.B, s.T, s.H}, DType::f32, s.permuted);
  std::unique_ptr<DevTensor> g, cu;
  Inputs in;
  in.q = q.view;
  in.k = k.view;
  in.v = v.view;
  in.w = w.view;
  in.beta = beta.view;
  if (s.gate) {
    g = std::make_unique<DevTensor>(P.g, std::vector<int64_t>{s.B, s.T, s.HQ}, DType::f32, s.permuted);
    in.g = g->view;
  }
  if (!P.cu.empty()) {
    cu = std::make_unique<DevTensor>(std::vector<double>(P.cu.size(), 0.0), std::vector<int64_t>{(int64_t)P.cu.size()},
                                     DType::f32, false);
    cu->buf.upload(P.cu.data());  // int32 bytes, same size as f32
    cu->view.dtype = DType::i32;
    in.cu_seqlens = cu->view;
  }
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
  std::vector<GpuSpec> c;
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128}) {
      // Lengths around the chunk size C = 64, and long enough to cross many chunks.
      for (int64_t T : {1, 2, 63, 64, 65, 200, 1000})
        c.push_back({{.B = T >= 1000 ? 1 : 2, .T = T, .H = 2, .HQ = 2, .D = D, .DV = D, .seed = 11 + uint64_t(T)}, dt});
      // GQA (HQ / H = 4) with the gate.
      for (int64_t T : {65, 200})
        c.push_back({{.B = 1, .T = T, .H = 1, .HQ = 4, .D = D, .DV = D, .gate = true, .seed = 3}, dt});
      // Varlen: length-1 sequences and sequences that straddle chunk boundaries of the packed tensor.
      c.push_back({{.B = 1, .T = 331, .H = 2, .HQ = 4, .D = D, .DV = D, .gate = dt == DType::bf16,
                    .seqlens = {1, 63, 1, 130, 64, 65, 7}, .seed = 5}, dt});
    }
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

// Unsupported cases throw pathattn::Error with the reason; the backward says it is not implemented.
TEST(CudaSupport, ClearReasons) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) GTEST_SKIP() << "no CUDA device";
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
  EXPECT_FALSE(sup.ok);
  EXPECT_NE(sup.reason.find("not implemented"), std::string::npos) << sup.reason;
}

}  // namespace
}  // namespace pathattn::test
