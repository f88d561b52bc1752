#include <stdexcept>

#include "task.h"

namespace pathattn::model {

namespace mqrar {
std::vector<int64_t> sequence(const MqrarConfig& cfg, std::mt19937_64& rng) {
  const int64_t K = cfg.keys, V = cfg.values, pairs = cfg.length / 2;
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::uniform_int_distribution<int64_t> pick_key(0, K - 1), pick_val(0, V - 1);
  std::vector<std::vector<int64_t>> hist(K);  // values assigned to each key, oldest first
  std::vector<int64_t> ready;                 // keys with at least N assignments
  std::vector<int64_t> s;
  s.reserve(2 * pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    if (!ready.empty() && u01(rng) < cfg.p_query) {
      const int64_t k = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng)];
      const auto& h = hist[k];
      s.push_back(K + V + k);
      s.push_back(K + h[h.size() - cfg.n_back]);
    } else {
      const int64_t k = pick_key(rng), v = pick_val(rng);
      hist[k].push_back(v);
      if (static_cast<int64_t>(hist[k].size()) == cfg.n_back) ready.push_back(k);
      s.push_back(k);
      s.push_back(K + v);
    }
  }
  return s;
}
}  // namespace mqrar

namespace {

class Mqrar final : public Task {
 public:
  explicit Mqrar(const MqrarConfig& cfg) : cfg_(cfg) {
    if (cfg.n_back < 1) throw std::invalid_argument("mqrar n_back: expected >= 1, got " + std::to_string(cfg.n_back));
    if (cfg.length < 4 || cfg.length % 2)
      throw std::invalid_argument("mqrar length: expected an even number >= 4, got " + std::to_string(cfg.length));
    if (cfg.keys < 1 || cfg.values < 2) throw std::invalid_argument("mqrar keys >= 1 and values >= 2 expected");
  }
  std::string name() const override { return "mqrar" + std::to_string(cfg_.n_back); }
  int64_t vocab() const override { return 2 * cfg_.keys + cfg_.values; }
  int64_t seq_len() const override { return cfg_.length - 1; }
  Batch sample(int64_t batch, std::mt19937_64& rng) const override {
    std::vector<std::vector<int64_t>> seqs;
    std::vector<std::vector<bool>> masks;
    const int64_t marker0 = cfg_.keys + cfg_.values;
    for (int64_t b = 0; b < batch; ++b) {
      auto s = mqrar::sequence(cfg_, rng);
      std::vector<bool> m(s.size() - 1);
      for (size_t t = 0; t + 1 < s.size(); ++t) m[t] = s[t] >= marker0;  // the answer follows a marker
      seqs.push_back(std::move(s));
      masks.push_back(std::move(m));
    }
    return make_batch(seqs, masks);
  }
  TaskConfig config() const override {
    TaskConfig c;
    c.name = "mqrar";
    c.mqrar = cfg_;
    return c;
  }

 private:
  MqrarConfig cfg_;
};

}  // namespace

std::unique_ptr<Task> make_mqrar(const MqrarConfig& cfg) { return std::make_unique<Mqrar>(cfg); }

}  // namespace pathattn::model
