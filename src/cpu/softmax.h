// Row softmax of a block of logits for the CPU path, with the forget-gate bias (Eq. 2).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace pathattn::cpu {

// Rows i in [0, n) of `l` (row stride ld, `cols` columns) are logits of query r0 + i against keys 0..cols-1.
// Adds G_{r0+i} - G_c when gcum is given, replaces each row by exp(l - max) / sum and writes lse[i].
inline void softmax_rows(float* l, int64_t n, int64_t cols, int64_t ld, const double* gcum, int64_t r0, float* lse) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = l + i * ld;
    if (gcum) {
      const double gi = gcum[r0 + i];
      for (int64_t c = 0; c < cols; ++c) row[c] += static_cast<float>(gi - gcum[c]);
    }
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, row[c]);
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += (row[c] = std::exp(row[c] - m));
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t c = 0; c < cols; ++c) row[c] *= inv;
    lse[i] = m + static_cast<float>(std::log(sum));
  }
}

}  // namespace pathattn::cpu
