#include <stdexcept>

#include "task.h"

namespace pathattn::model {

namespace ff {
std::vector<int64_t> sequence(int64_t pairs, double p_ignore, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::vector<int64_t> s;
  s.reserve(2 * pairs);
  int64_t last = -1;
  for (int64_t p = 0; p < pairs; ++p) {
    int64_t instr;
    if (p == 0) {
      instr = W;
    } else if (p == pairs - 1) {
      instr = R;
    } else {
      const double u = u01(rng);
      instr = u < p_ignore ? I : (u < p_ignore + (1.0 - p_ignore) / 2 ? W : R);
    }
    int64_t bit = (u01(rng) < 0.5) ? B0 : B1;
    if (instr == R) bit = last;
    if (instr == W) last = bit;
    s.push_back(instr);
    s.push_back(bit);
  }
  return s;
}
}  // namespace ff

namespace {

class FlipFlop final : public Task {
 public:
  explicit FlipFlop(const FlipFlopConfig& cfg) : cfg_(cfg) {
    if (cfg.pairs < 2) throw std::invalid_argument("flip-flop pairs: expected >= 2, got " + std::to_string(cfg.pairs));
    if (cfg.eval_p.size() != cfg.eval_names.size())
      throw std::invalid_argument("flip-flop eval_p and eval_names must have the same length");
  }
  std::string name() const override { return "flipflop"; }
  int64_t vocab() const override { return 5; }
  int64_t seq_len() const override { return 2 * cfg_.pairs - 1; }
  Batch sample(int64_t batch, std::mt19937_64& rng) const override { return draw(batch, cfg_.p_ignore, rng); }
  std::vector<EvalSet> eval_sets(int64_t size, uint64_t seed) const override {
    std::vector<EvalSet> sets;
    for (size_t i = 0; i < cfg_.eval_p.size(); ++i) {
      std::mt19937_64 rng(seed * 1000003ULL + i);
      sets.push_back({cfg_.eval_names[i], draw(size, cfg_.eval_p[i], rng)});
    }
    return sets;
  }
  TaskConfig config() const override {
    TaskConfig c;
    c.name = "flipflop";
    c.flipflop = cfg_;
    return c;
  }

 private:
  Batch draw(int64_t batch, double p_ignore, std::mt19937_64& rng) const {
    std::vector<std::vector<int64_t>> seqs;
    std::vector<std::vector<bool>> masks;
    for (int64_t b = 0; b < batch; ++b) {
      auto s = ff::sequence(cfg_.pairs, p_ignore, rng);
      std::vector<bool> m(s.size() - 1);
      for (size_t t = 0; t + 1 < s.size(); ++t) m[t] = s[t] == ff::R;  // predict the bit after r
      seqs.push_back(std::move(s));
      masks.push_back(std::move(m));
    }
    return make_batch(seqs, masks);
  }
  FlipFlopConfig cfg_;
};

}  // namespace

std::unique_ptr<Task> make_flipflop(const FlipFlopConfig& cfg) { return std::make_unique<FlipFlop>(cfg); }

}  // namespace pathattn::model
