// One (sequence, kv head) of a problem gathered into contiguous float32 rows for the CPU path, and the
// scatter of its results back into the caller's strided views.
#pragma once

#include <vector>

#include "common/problem.h"
#include "cpu/chunk.h"

namespace pathattn::cpu {

struct HeadData {
  int64_t L = 0, D = 0, DV = 0, G = 0;  // length, dims, query heads per kv head
  std::vector<float> q;                 // [G, L, D]
  std::vector<float> k, w;              // [L, D]
  std::vector<float> v;                 // [L, DV]
  std::vector<float> beta;              // [L]
  std::vector<double> gcum;             // [G, L] G_t (Eq. 2), empty without gate. Double: G_i - G_j keeps its
                                        // precision at long T (a float G of -8000 would keep only 5e-4).
  int64_t chunks() const { return (L + kChunk - 1) / kChunk; }
};

HeadData gather_head(const Problem& p, const Inputs& in, const Segment& s, int64_t h);

// Rows [r0, r0 + n) of a [G, L, X] or [L, X] buffer.
inline float* rows(std::vector<float>& x, int64_t r0, int64_t width) { return x.data() + r0 * width; }
inline const float* rows(const std::vector<float>& x, int64_t r0, int64_t width) { return x.data() + r0 * width; }

// Writes rows of a [L, X] buffer into a [B, T, heads, X] view at (s.b, s.t0 + t, head).
void scatter(const float* x, int64_t X, const TensorView& t, const Segment& s, int64_t head);
// Writes a [L] buffer into a [B, T, heads] view.
void scatter_scalar(const float* x, const TensorView& t, const Segment& s, int64_t head);
// Reads rows of a [B, T, heads, X] view into a [L, X] buffer.
void gather(const TensorView& t, const Segment& s, int64_t head, int64_t X, float* out);

}  // namespace pathattn::cpu
