// Language-model evaluation beyond the trainer's: next-token loss at every position of windows far longer than
// the training length (length extrapolation, the paper's Figure 3), summed over windows and then bucketed.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "lm_shard.h"
#include "precision.h"
#include "transformer.h"

namespace pathattn::model {

struct PositionLoss {
  std::vector<double> sum;  // [length] summed next-token loss (nats) at each position over the windows
  int64_t windows = 0;
  double mean(int64_t begin, int64_t end) const;  // mean loss over positions [begin, end) and the windows
};

// `windows` windows of length + 1 tokens evenly spaced over the stream (task_lm.h even_windows), `batch` at a time
// through the model (no KV cache: one forward over the whole window, as training runs).
PositionLoss loss_by_position(Transformer& model, const lm::TokenStream& stream, int64_t length, int64_t windows,
                              int64_t batch, torch::Device dev, Precision precision);

// CSV: bucket_start,bucket_end,loss,ppl (positions [start, end), 0-based; loss the mean in nats).
void write_position_csv(const PositionLoss& pl, int64_t bucket, const std::string& path);

}  // namespace pathattn::model
