#include "read_eval.h"

#include <chrono>

#include "task.h"

namespace pathattn::model {

ReadScore score_flipflop_reads(Transformer& model, const std::vector<std::vector<int64_t>>& seqs,
                               const SamplingConfig& s) {
  ReadScore r;
  const auto t0 = std::chrono::steady_clock::now();
  const auto dev = model->parameters().front().device();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& seq = seqs[i];
    SamplingConfig si = s;
    si.seed = s.seed + i;
    Decoder d(model, si);
    int64_t fed = 0;  // tokens of seq in the cache
    for (int64_t t = 0; t + 1 < static_cast<int64_t>(seq.size()); t += 2) {
      if (seq[t] != ff::R) continue;
      // Feed seq[fed .. t] (ends with the read), generate the answer, score it against the true bit seq[t + 1].
      auto chunk = torch::tensor(std::vector<int64_t>(seq.begin() + fed, seq.begin() + t + 1), torch::kLong);
      auto answer = d.sample(d.feed(chunk.view({1, -1}).to(dev)));
      r.fed += t + 1 - fed;
      fed = t + 1;
      ++r.reads;
      r.answers.push_back(answer.item<int64_t>());
      r.correct += r.answers.back() == seq[t + 1];
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace pathattn::model
