// The optional value check of the CUDA backend (value_check.h).
#include <limits>
#include <sstream>
#include <string>

#include "common/env.h"
#include "cuda/check.h"
#include "cuda/value_check.h"

namespace pathattn::cuda {
namespace {

// The smallest flat index i (over [B, T, X] in row-major order) whose value is not in [lo, hi] (NaN included):
// atomicMin on *first, which starts at UINT64_MAX.
__global__ void first_out_of_range(const float* x, int64_t sb, int64_t st, int64_t sx, int64_t T, int64_t X,
                                   int64_t n, float lo, float hi, unsigned long long* first) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = i / (T * X), t = (i / X) % T, h = i % X;
    const float v = x[b * sb + t * st + h * sx];
    if (!(v >= lo && v <= hi)) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

void check_one(const TensorView& t, const char* name, float lo, float hi, const char* expected, cudaStream_t stream,
               unsigned long long* first) {
  const int64_t B = t.sizes[0], T = t.sizes[1], X = t.sizes[2], n = B * T * X;
  if (n == 0) return;
  const unsigned long long none = std::numeric_limits<unsigned long long>::max();
  CUDA_CHECK(cudaMemcpyAsync(first, &none, sizeof(none), cudaMemcpyHostToDevice, stream));
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 1024));
  first_out_of_range<<<blocks, 256, 0, stream>>>(static_cast<const float*>(t.data), t.strides[0], t.strides[1],
                                                  t.strides[2], T, X, n, lo, hi, first);
  CUDA_CHECK_LAUNCH("first_out_of_range");
  unsigned long long bad = none;
  CUDA_CHECK(cudaMemcpyAsync(&bad, first, sizeof(bad), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bad == none) return;
  const int64_t i = static_cast<int64_t>(bad), b = i / (T * X), tt = (i / X) % T, h = i % X;
  float v = 0.f;
  CUDA_CHECK(cudaMemcpy(&v, static_cast<const float*>(t.data) + b * t.strides[0] + tt * t.strides[1] + h * t.strides[2],
                        sizeof(v), cudaMemcpyDeviceToHost));
  std::ostringstream s;
  s << "pathattn: " << name << " must be " << expected << ", got " << v << " at [" << b << ", " << tt << ", " << h << "]";
  throw Error(s.str());
}

}  // namespace

bool checks_values(const Inputs& in) {
  if (in.check_values) return true;
  static const bool on = env::flag("PATHATTN_CHECK_VALUES", false);
  return on;
}

void check_values(const Inputs& in, const Problem& p, cudaStream_t stream) {
  unsigned long long* first = nullptr;
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&first), sizeof(*first), stream));
  try {
    check_one(in.beta, "beta", 0.f, 2.f, "in [0, 2] (not NaN)", stream, first);
    if (p.has_gate)
      check_one(in.g, "g", -std::numeric_limits<float>::max(), 0.f,
                "a finite log forget gate <= 0 (not NaN or -inf: G_i - G_j would be NaN)", stream, first);
  } catch (...) {
    (void)cudaFreeAsync(first, stream);  // unchecked: the error being thrown is the one to report
    throw;
  }
  CUDA_CHECK(cudaFreeAsync(first, stream));
}

}  // namespace pathattn::cuda
