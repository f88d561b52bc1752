#include "generate.h"

#include <chrono>
#include <sstream>
#include <stdexcept>
#include <string>

#include <torch/cuda.h>

namespace pathattn::model {

void sync(const torch::Tensor& t) {
  if (t.is_cuda()) torch::cuda::synchronize();  // the timings must cover the device's work
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Decoder::Decoder(Transformer model, const SamplingConfig& s)
    : model_(std::move(model)), s_(s), gen_(at::detail::createCPUGenerator(s.seed)) {
  s_.validate();
}

void Decoder::check_tokens(const torch::Tensor& tokens) const {
  if (tokens.dim() != 2 || tokens.scalar_type() != torch::kLong || tokens.size(1) < 1) {
    std::ostringstream got;
    got << tokens.sizes() << " " << tokens.scalar_type();
    throw std::invalid_argument("tokens: expected [B, S] int64 with S >= 1, got " + got.str());
  }
  const int64_t V = model_->config().vocab;
  auto bad = (tokens < 0) | (tokens >= V);
  if (bad.any().item<bool>()) {
    auto at = bad.nonzero()[0];  // [2]: the first bad (sequence, position)
    const int64_t b = at[0].item<int64_t>(), t = at[1].item<int64_t>();
    throw std::invalid_argument("tokens: id " + std::to_string(tokens[b][t].item<int64_t>()) + " at [" +
                                std::to_string(b) + ", " + std::to_string(t) + "] is outside the vocabulary [0, " +
                                std::to_string(V) + ")");
  }
  if (cached_ > 0 && tokens.size(0) != batch_)
    throw std::invalid_argument("tokens: expected the cached batch of " + std::to_string(batch_) + " sequences, got " +
                                std::to_string(tokens.size(0)));
}

torch::Tensor Decoder::feed(const torch::Tensor& tokens) {
  check_tokens(tokens);
  torch::NoGradGuard no_grad;
  auto logits = model_->forward(tokens, &cache_).select(1, -1);  // [B, V]
  cached_ += tokens.size(1);
  batch_ = tokens.size(0);
  return logits;
}

torch::Tensor Decoder::score(const torch::Tensor& tokens) {
  check_tokens(tokens);
  if (cached_ == 0) throw std::invalid_argument("tokens: score() needs a cache that holds a prompt (feed() it first)");
  torch::NoGradGuard no_grad;
  return model_->forward(tokens, &cache_, /*commit=*/false);
}

torch::Tensor Decoder::sample(const torch::Tensor& logits) { return sample_next(logits, s_, gen_); }

torch::Tensor generate(Transformer& model, const torch::Tensor& prompt, int64_t n, const SamplingConfig& s,
                       GenerateStats* stats) {
  if (n < 0) throw std::invalid_argument("n: expected >= 0 tokens to generate, got " + std::to_string(n));
  Decoder d(model, s);
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = d.feed(prompt);
  sync(logits);
  const double prefill_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> out{prompt};
  for (int64_t i = 0; i < n; ++i) {
    auto next = d.sample(logits);  // [B, 1]
    out.push_back(next);
    if (i + 1 < n) logits = d.feed(next);
  }
  auto seq = torch::cat(out, 1);
  sync(seq);
  if (stats) {
    stats->prefill_tokens = prompt.numel();
    stats->prefill_s = prefill_s;
    stats->decode_tokens = prompt.size(0) * n;
    stats->decode_s = n > 0 ? seconds_since(t1) : 0.0;
  }
  return seq;
}

}  // namespace pathattn::model
