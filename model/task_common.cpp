#include <stdexcept>

#include "task.h"
#include "task_lm.h"

namespace pathattn::model {

Batch make_batch(const std::vector<std::vector<int64_t>>& seqs, const std::vector<std::vector<bool>>& mask) {
  const int64_t B = static_cast<int64_t>(seqs.size()), T = static_cast<int64_t>(seqs.at(0).size()) - 1;
  auto input = torch::empty({B, T}, torch::kLong), target = torch::empty({B, T}, torch::kLong);
  auto m = torch::empty({B, T}, torch::kBool);
  auto pi = input.accessor<int64_t, 2>(), pt = target.accessor<int64_t, 2>();
  auto pm = m.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      pi[b][t] = seqs[b][t];
      pt[b][t] = seqs[b][t + 1];
      pm[b][t] = mask[b][t];
    }
  }
  return {input, target, m};
}

std::unique_ptr<Task> make_task(const TaskConfig& cfg) {
  if (cfg.name == "flipflop") return make_flipflop(cfg.flipflop);
  if (cfg.name == "a5") return make_a5(cfg.a5);
  if (cfg.name == "mqrar") return make_mqrar(cfg.mqrar);
  if (cfg.name == "lm") {
    if (cfg.lm.data_dir.empty()) throw std::invalid_argument("--task lm needs --lm-data FOLDER");
    return make_lm(cfg.lm);
  }
  throw std::invalid_argument("task: expected flipflop, a5, mqrar or lm, got '" + cfg.name + "'");
}

}  // namespace pathattn::model
