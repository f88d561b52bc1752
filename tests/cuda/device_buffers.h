// Device memory for the GPU tests: every buffer lies between guard bands of a fixed byte pattern and its body starts
// as NaN (0xFF bytes), so that an element a kernel leaves unwritten or a write outside a tensor is caught. Shared
// by test_cuda_forward and test_cuda_backward.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "pathattn/pathattn.h"

namespace pathattn::test {

#define TEST_CUDA(call)                                                                          \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_) << " at " << __FILE__ \
                               << ":" << __LINE__;                                               \
  } while (0)

// Where an ASSERT cannot stop the test (constructors, value-returning helpers): a failed call throws, naming it,
// and gtest reports the exception as the test's failure.
inline void dev_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline bool have_cuda_device() {
  int ndev = 0;
  return cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
}

inline uint16_t to_lowp(double x, DType dt) {
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
inline double from_lowp(uint16_t u, DType dt) {
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
    dev_check(cudaMalloc(&base, n + 2 * kGuard), "cudaMalloc of a test buffer");
    dev_check(cudaMemset(base, 0xA5, kGuard), "cudaMemset of a guard band");
    dev_check(cudaMemset(base + kGuard, 0xFF, n), "cudaMemset of a test buffer");
    dev_check(cudaMemset(base + kGuard + n, 0xA5, kGuard), "cudaMemset of a guard band");
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { (void)cudaFree(base); }  // unchecked: a destructor may not throw
  void* data() const { return base + kGuard; }
  void upload(const void* src) { dev_check(cudaMemcpy(data(), src, bytes, cudaMemcpyHostToDevice), "upload"); }
  template <typename X>
  std::vector<X> download() const {
    std::vector<X> h(bytes / sizeof(X));
    dev_check(cudaMemcpy(h.data(), data(), bytes, cudaMemcpyDeviceToHost), "download");
    return h;
  }
  bool guards_intact() const {
    std::vector<unsigned char> g(kGuard);
    for (size_t at : {size_t(0), kGuard + bytes}) {
      dev_check(cudaMemcpy(g.data(), base + at, kGuard, cudaMemcpyDeviceToHost), "download of a guard band");
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
      } else if (dt == DType::f64) {
        std::memcpy(&host[off * 8], &src[lin], 8);
      } else if (dt == DType::i32) {
        const int32_t i = static_cast<int32_t>(src[lin]);
        std::memcpy(&host[off * 4], &i, 4);
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

inline int64_t count_nonfinite(const std::vector<double>& x) {
  int64_t n = 0;
  for (double e : x) n += !std::isfinite(e);
  return n;
}

}  // namespace pathattn::test
