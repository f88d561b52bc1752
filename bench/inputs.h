// Random inputs of the CPU benchmarks, drawn as the layer would produce them (docs/spec.md §5): q, k, v ~ N(0, 1),
// w rows of unit norm, beta = 2 sigmoid(N(0, 1)).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace pathattn::bench {

struct InputDraws {
  std::mt19937_64 rng;
  std::normal_distribution<float> n01{0.f, 1.f};
  explicit InputDraws(uint64_t seed) : rng(seed) {}

  void normal(std::vector<float>& x, int64_t n) {
    x.resize(n);
    for (float& e : x) e = n01(rng);
  }
  // rows x dim normal draws, each row scaled to unit norm.
  void unit_rows(std::vector<float>& x, int64_t rows, int64_t dim) {
    normal(x, rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      float n = 0;
      for (int64_t d = 0; d < dim; ++d) n += x[r * dim + d] * x[r * dim + d];
      for (int64_t d = 0; d < dim; ++d) x[r * dim + d] /= std::sqrt(n);
    }
  }
  void beta(std::vector<float>& x, int64_t n) {
    x.resize(n);
    for (float& b : x) b = 2.f / (1.f + std::exp(-n01(rng)));
  }
};

}  // namespace pathattn::bench
