#include <algorithm>
#include <stdexcept>

#include "task.h"

namespace pathattn::model {

namespace a5 {
namespace {
struct Tables {
  std::vector<std::array<int, 5>> elems;
  std::vector<int> table;  // [60 * 60]
};
const Tables& tables() {
  static const Tables t = [] {
    Tables r;
    std::array<int, 5> p{0, 1, 2, 3, 4};
    do {
      int inv = 0;
      for (int i = 0; i < 5; ++i)
        for (int j = i + 1; j < 5; ++j) inv += p[i] > p[j];
      if (inv % 2 == 0) r.elems.push_back(p);
    } while (std::next_permutation(p.begin(), p.end()));
    const int n = static_cast<int>(r.elems.size());
    r.table.resize(n * n);
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        std::array<int, 5> c;
        for (int i = 0; i < 5; ++i) c[i] = r.elems[a][r.elems[b][i]];
        r.table[a * n + b] = static_cast<int>(std::find(r.elems.begin(), r.elems.end(), c) - r.elems.begin());
      }
    }
    return r;
  }();
  return t;
}
}  // namespace
const std::vector<std::array<int, 5>>& elements() { return tables().elems; }
int mul(int a, int b) { return tables().table[a * 60 + b]; }
}  // namespace a5

namespace {

class A5 final : public Task {
 public:
  explicit A5(const A5Config& cfg) : cfg_(cfg) {
    if (cfg.length < 1) throw std::invalid_argument("a5 length: expected >= 1, got " + std::to_string(cfg.length));
  }
  std::string name() const override { return "a5"; }
  int64_t vocab() const override { return cfg_.bos ? 61 : 60; }
  int64_t seq_len() const override { return cfg_.length + (cfg_.bos ? 1 : 0); }
  Batch sample(int64_t batch, std::mt19937_64& rng) const override {
    std::uniform_int_distribution<int> pick(0, 59);
    const int64_t L = cfg_.length, t0 = cfg_.bos ? 1 : 0;  // t0: where the elements start
    auto input = torch::empty({batch, L + t0}, torch::kLong), target = torch::empty({batch, L + t0}, torch::kLong);
    auto mask = torch::ones({batch, L + t0}, torch::kBool);
    auto pi = input.accessor<int64_t, 2>(), pt = target.accessor<int64_t, 2>();
    for (int64_t b = 0; b < batch; ++b) {
      if (t0) {  // the BOS token, its target (the identity, 0) not scored
        pi[b][0] = kBos;
        pt[b][0] = 0;
      }
      int prod = -1;
      for (int64_t t = 0; t < L; ++t) {
        const int x = pick(rng);
        prod = prod < 0 ? x : a5::mul(prod, x);
        pi[b][t0 + t] = x;
        pt[b][t0 + t] = prod;
      }
    }
    if (t0) mask.select(1, 0).fill_(false);
    return {input, target, mask};
  }
  TaskConfig config() const override {
    TaskConfig c;
    c.name = "a5";
    c.a5 = cfg_;
    return c;
  }

 private:
  static constexpr int kBos = 60;
  A5Config cfg_;
};

}  // namespace

std::unique_ptr<Task> make_a5(const A5Config& cfg) { return std::make_unique<A5>(cfg); }

}  // namespace pathattn::model
