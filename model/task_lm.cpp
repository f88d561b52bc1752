#include "task_lm.h"

#include <stdexcept>

namespace pathattn::model {

namespace {

// [B, T + 1] windows -> (input, target, mask all set).
Batch to_batch(const torch::Tensor& windows) {
  const int64_t T = windows.size(1) - 1;
  return {windows.narrow(1, 0, T).contiguous(), windows.narrow(1, 1, T).contiguous(),
          torch::ones({windows.size(0), T}, torch::kBool)};
}

class Lm final : public Task {
 public:
  explicit Lm(const LmConfig& cfg)
      : cfg_(cfg),
        train_(lm::split_shards(cfg.data_dir, "train", cfg.train_shards)),
        valid_(lm::split_shards(cfg.data_dir, "valid")) {
    if (cfg.seq_len < 1) throw std::invalid_argument("lm seq_len: expected >= 1, got " + std::to_string(cfg.seq_len));
    if (train_.size() < cfg.seq_len + 1)
      throw std::invalid_argument("lm: the train split has " + std::to_string(train_.size()) +
                                  " tokens, fewer than seq_len + 1 = " + std::to_string(cfg.seq_len + 1));
    if (valid_.vocab() != train_.vocab())
      throw std::invalid_argument("lm: valid shards have vocab " + std::to_string(valid_.vocab()) + ", train " +
                                  std::to_string(train_.vocab()));
  }
  std::string name() const override { return "lm"; }
  int64_t vocab() const override { return train_.vocab(); }
  int64_t seq_len() const override { return cfg_.seq_len; }
  bool language_model() const override { return true; }
  TaskConfig config() const override {
    TaskConfig c;
    c.name = "lm";
    c.lm = cfg_;
    return c;
  }
  std::string data_state() const override {
    return "lm seq_len=" + std::to_string(cfg_.seq_len) + " train[" + train_.fingerprint() + "] valid[" +
           valid_.fingerprint() + "]";
  }
  Batch sample(int64_t batch, std::mt19937_64& rng) const override {
    const int64_t T = cfg_.seq_len;
    auto w = torch::empty({batch, T + 1}, torch::kLong);
    for (int64_t b = 0; b < batch; ++b)
      train_.copy(window_start(rng(), train_.size(), T), T + 1, w[b].data_ptr<int64_t>());
    return to_batch(w);
  }
  // Fixed windows of the validation stream; `seed` is not used (the set is the same in every run by design).
  std::vector<EvalSet> eval_sets(int64_t size, uint64_t) const override {
    return {{"valid", even_windows(valid_, size, cfg_.seq_len + 1)}};
  }

 private:
  LmConfig cfg_;
  lm::TokenStream train_, valid_;
};

}  // namespace

int64_t window_start(uint64_t r, int64_t stream_size, int64_t seq_len) {
  const int64_t starts = stream_size - seq_len;  // starts 0 .. N - T - 1 leave T + 1 tokens
  if (starts <= 0)
    throw std::invalid_argument("lm: a stream of " + std::to_string(stream_size) + " tokens has no window of " +
                                std::to_string(seq_len + 1));
  return static_cast<int64_t>(r % static_cast<uint64_t>(starts));
}

Batch even_windows(const lm::TokenStream& stream, int64_t count, int64_t len_plus_one) {
  if (count < 1) throw std::invalid_argument("even_windows: count expected >= 1, got " + std::to_string(count));
  const int64_t span = stream.size() - len_plus_one;
  if (span < 0)
    throw std::invalid_argument("even_windows: the stream has " + std::to_string(stream.size()) +
                                " tokens, fewer than a window of " + std::to_string(len_plus_one));
  auto w = torch::empty({count, len_plus_one}, torch::kLong);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t start = count == 1 ? 0 : i * span / (count - 1);
    stream.copy(start, len_plus_one, w[i].data_ptr<int64_t>());
  }
  return to_batch(w);
}

std::unique_ptr<Task> make_lm(const LmConfig& cfg) { return std::make_unique<Lm>(cfg); }

}  // namespace pathattn::model
