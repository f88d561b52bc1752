#include "sampling.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace pathattn::model {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
std::string num(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}
}  // namespace

void SamplingConfig::validate() const {
  // Written as !(ok) so that NaN fails every check.
  if (!(temperature >= 0.0) || std::isinf(temperature))
    throw std::invalid_argument("temperature: expected a finite value >= 0 (0: greedy), got " + num(temperature));
  if (top_k < 0) throw std::invalid_argument("top_k: expected >= 0 (0: off), got " + std::to_string(top_k));
  if (!(top_p > 0.0 && top_p <= 1.0))
    throw std::invalid_argument("top_p: expected a value in (0, 1] (1: off), got " + num(top_p));
}

torch::Tensor top_k_filter(const torch::Tensor& logits, int64_t k) {
  if (k < 0) throw std::invalid_argument("top_k: expected >= 0 (0: off), got " + std::to_string(k));
  const int64_t V = logits.size(-1);
  if (k == 0 || k >= V) return logits;
  auto kth = std::get<0>(logits.topk(k, -1)).narrow(-1, k - 1, 1);  // [..., 1], the k-th largest
  return logits.masked_fill(logits < kth, kNegInf);
}

torch::Tensor top_p_filter(const torch::Tensor& logits, double p) {
  if (!(p > 0.0 && p <= 1.0)) throw std::invalid_argument("top_p: expected a value in (0, 1] (1: off), got " + num(p));
  if (p == 1.0) return logits;
  // f64 so that the cumulative sums of a large vocabulary do not drift across the threshold.
  auto probs = torch::softmax(logits.to(torch::kDouble), -1);
  auto sorted = std::get<0>(probs.sort(-1, /*descending=*/true));
  const int64_t V = logits.size(-1);
  // Exclusive cumulative sum: before[j] is the mass of the tokens sorted ahead of j.
  auto before = torch::cat({torch::zeros_like(sorted.narrow(-1, 0, 1)), sorted.cumsum(-1).narrow(-1, 0, V - 1)}, -1);
  auto n_keep = (before < p).sum(-1, /*keepdim=*/true);   // >= 1: before[0] = 0 < p
  auto last_kept = sorted.gather(-1, n_keep - 1);         // [..., 1]
  return logits.masked_fill(probs < last_kept, kNegInf);  // ties with the last kept token stay
}

torch::Tensor sample_next(const torch::Tensor& logits, const SamplingConfig& s, at::Generator& gen) {
  if (logits.dim() != 2) throw std::invalid_argument("logits: expected [B, V], got " + std::to_string(logits.dim()) + " dimensions");
  s.validate();
  if (s.temperature == 0.0) return logits.argmax(-1, /*keepdim=*/true);
  auto l = top_p_filter(top_k_filter(logits.to(torch::kFloat).cpu() / s.temperature, s.top_k), s.top_p);
  auto probs = torch::softmax(l, -1);
  return at::multinomial(probs, 1, /*replacement=*/false, gen).to(logits.device());
}

}  // namespace pathattn::model
