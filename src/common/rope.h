// The fused RoPE rotation (pathattn.h `rope_rotate`): the validated sizes both backends take, and their entry points.
#pragma once

#include "pathattn/pathattn.h"

namespace pathattn {

struct RopeProblem {
  int64_t B = 0, T = 0, H = 0, D = 0;
};

namespace cpu {
void rope_rotate(const RopeProblem& p, const RopeRotate& in, const TensorView& out);
}  // namespace cpu

#ifdef PATHATTN_WITH_CUDA
namespace cuda {
void rope_rotate(const RopeProblem& p, const RopeRotate& in, const TensorView& out);
}  // namespace cuda
#endif

}  // namespace pathattn
