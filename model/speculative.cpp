#include "speculative.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace pathattn::model {

void SpeculativeConfig::validate() const {
  if (draft < 1 || draft > 63)
    throw std::invalid_argument("draft: expected 1..63 tokens (one call without commit scores <= 64), got " +
                                std::to_string(draft));
  if (ngram < 1) throw std::invalid_argument("ngram: expected >= 1, got " + std::to_string(ngram));
}

namespace {

// The `max` tokens that followed the latest earlier occurrence of seq's last `ngram` tokens, copied as LZ77 copies:
// past the end of seq the copy reads its own first tokens, so a pattern of period p found p tokens back continues
// for all `max` (the latest occurrence is often that close: "4 4" just before "4 4"). None when they do not recur.
std::vector<int64_t> lookup_draft(const std::vector<int64_t>& seq, int64_t ngram, int64_t max) {
  const int64_t L = static_cast<int64_t>(seq.size());
  if (max <= 0 || L <= ngram) return {};
  for (int64_t s = L - ngram - 1; s >= 0; --s)
    if (std::equal(seq.begin() + s, seq.begin() + s + ngram, seq.end() - ngram)) {
      std::vector<int64_t> draft;
      for (int64_t i = s + ngram; static_cast<int64_t>(draft.size()) < max; ++i)
        draft.push_back(i < L ? seq[i] : draft[i - L]);
      return draft;
    }
  return {};
}

torch::Tensor row(const std::vector<int64_t>& ids, const torch::Device& dev) {
  return torch::tensor(ids, torch::kLong).view({1, -1}).to(dev);
}

}  // namespace

torch::Tensor generate_speculative(Transformer& model, const torch::Tensor& prompt, int64_t n,
                                   const SpeculativeConfig& c, GenerateStats* stats, SpeculativeStats* spec) {
  c.validate();
  if (n < 0) throw std::invalid_argument("n: expected >= 0 tokens to generate, got " + std::to_string(n));
  if (prompt.dim() != 2 || prompt.size(0) != 1 || prompt.size(1) < 1 || prompt.scalar_type() != torch::kLong)
    throw std::invalid_argument("prompt: expected [1, T0] int64 with T0 >= 1 (one sequence: the cache holds one "
                                "length per batch, and each sequence accepts its own number of draft tokens)");
  Decoder d(model, SamplingConfig{});  // greedy
  const torch::Device dev = prompt.device();
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = d.feed(prompt);  // [1, V]
  sync(logits);
  const double prefill_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  auto p = prompt.cpu().contiguous();
  std::vector<int64_t> seq(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());  // the fed tokens
  std::vector<int64_t> gen;  // the generated tokens; the last one is not fed yet
  SpeculativeStats st;
  if (n > 0) gen.push_back(d.sample(logits).item<int64_t>());
  while (static_cast<int64_t>(gen.size()) < n) {
    seq.push_back(gen.back());  // the context the draft continues
    const std::vector<int64_t> draft =
        lookup_draft(seq, c.ngram, std::min<int64_t>(c.draft, n - static_cast<int64_t>(gen.size()) - 1));
    std::vector<int64_t> ids{gen.back()};
    size_t accepted = 0;
    if (!draft.empty()) {
      ids.insert(ids.end(), draft.begin(), draft.end());
      // What greedy decoding picks after the pending token and after each draft token; a draft token counts while
      // it is the one picked after its predecessor.
      auto picks = d.score(row(ids, dev)).select(0, 0).argmax(-1).cpu();  // [k + 1]
      while (accepted < draft.size() && draft[accepted] == picks[accepted].item<int64_t>()) ++accepted;
      st.drafted += static_cast<int64_t>(draft.size());
      st.accepted += static_cast<int64_t>(accepted);
      ids.resize(1 + accepted);
    }
    logits = d.feed(row(ids, dev));
    ++st.steps;
    for (size_t i = 0; i < accepted; ++i) {
      gen.push_back(draft[i]);
      seq.push_back(draft[i]);
    }
    gen.push_back(d.sample(logits).item<int64_t>());
  }
  auto out = torch::cat({prompt, row(gen, dev).view({1, static_cast<int64_t>(gen.size())})}, 1);
  sync(out);
  if (stats) {
    stats->prefill_tokens = prompt.numel();
    stats->prefill_s = prefill_s;
    stats->decode_tokens = n;
    stats->decode_s = n > 0 ? seconds_since(t1) : 0.0;
  }
  if (spec) *spec = st;
  return out;
}

}  // namespace pathattn::model
