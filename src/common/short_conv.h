// The fused short convolution of the PaTH layer's w (pathattn.h `short_conv_w`, docs/math.md Eq. 44-46): the
// validated sizes every backend takes, and the backends' entry points.
#pragma once

#include <vector>

#include "pathattn/pathattn.h"

namespace pathattn {

struct ConvProblem {
  int64_t B = 0, T = 0, C = 0, K = 0, H = 0, D = 0;
  bool has_state = false;
  bool varlen = false;
  double eps = 1e-12;
  Device device = Device::cpu;
  int device_index = 0;
  // CPU only: the first row of the sequence that row t belongs to (varlen), else empty (every row's is 0).
  std::vector<int64_t> seq_start;
};

// Validates `in` (throws Error naming the argument) and returns the sizes; reads cu_seqlens when it is on the CPU.
ConvProblem make_conv_problem(const ShortConvW& in);
// Checks the values of cu_seqlens (host memory: n + 1 entries, `stride` apart) against p.T and fills p.seq_start.
void set_seq_starts(ConvProblem& p, const int32_t* cu, int64_t n, int64_t stride);

namespace cpu {
void short_conv_w(const ConvProblem& p, const ShortConvW& in, const TensorView& w);
void short_conv_w_backward(const ConvProblem& p, const ShortConvW& in, const TensorView& dw, const TensorView& du,
                           const TensorView& dweight, const TensorView& dstate);
}  // namespace cpu

#ifdef PATHATTN_WITH_CUDA
namespace cuda {
void short_conv_w(const ConvProblem& p, const ShortConvW& in, const TensorView& w);
void short_conv_w_backward(const ConvProblem& p, const ShortConvW& in, const TensorView& dw, const TensorView& du,
                           const TensorView& dweight, const TensorView& dstate);
}  // namespace cuda
#endif

}  // namespace pathattn
