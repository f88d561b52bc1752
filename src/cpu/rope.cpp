// The fused RoPE rotation on the CPU (pathattn.h `rope_rotate`), f32 or f64: the readable statement of what the CUDA
// kernel (src/cuda/kernels/rope.cuh) computes. Compiled with -ffp-contract=off (src/CMakeLists.txt): each product is
// rounded before the sum, as in the composed form of ATen operators it replaces, so the two agree bit for bit.
#include "common/problem.h"
#include "common/rope.h"

namespace pathattn::cpu {
namespace {

template <typename F>
void rotate(const RopeProblem& p, const RopeRotate& in, const TensorView& out) {
  const int64_t half = p.D / 2;
  const F* cs = static_cast<const F*>(in.cos.data);
  const F* sn = static_cast<const F*>(in.sin.data);
  parallel_for(p.B * p.T, [&](int64_t bt) {
    const int64_t b = bt / p.T, t = bt % p.T;
    const F* c = cs + t * half;
    const F* s = sn + t * half;
    for (int64_t h = 0; h < p.H; ++h) {
      const F* x = static_cast<const F*>(in.x.data) + offset(in.x, b, t, h);
      F* y = static_cast<F*>(out.data) + offset(out, b, t, h);
      for (int64_t j = 0; j < half; ++j) {
        const F x1 = x[j], x2 = x[half + j];
        const F a = x1 * c[j], bb = x2 * s[j], e = x1 * s[j], f = x2 * c[j];
        if (in.inverse) {
          y[j] = a + bb;      // x1 cos + x2 sin
          y[half + j] = f - e;  // x2 cos - x1 sin
        } else {
          y[j] = a - bb;      // x1 cos - x2 sin
          y[half + j] = e + f;  // x1 sin + x2 cos
        }
      }
    }
  });
}

}  // namespace

void rope_rotate(const RopeProblem& p, const RopeRotate& in, const TensorView& out) {
  if (in.x.dtype == DType::f64)
    rotate<double>(p, in, out);
  else
    rotate<float>(p, in, out);
}

}  // namespace pathattn::cpu
