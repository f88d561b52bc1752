#include "lm_eval.h"

#include <cmath>
#include <fstream>
#include <stdexcept>

#include "task_lm.h"

namespace pathattn::model {

double PositionLoss::mean(int64_t begin, int64_t end) const {
  end = std::min<int64_t>(end, static_cast<int64_t>(sum.size()));
  if (begin >= end || windows == 0) return NAN;
  double s = 0;
  for (int64_t t = begin; t < end; ++t) s += sum[t];
  return s / (static_cast<double>(end - begin) * windows);
}

PositionLoss loss_by_position(Transformer& model, const lm::TokenStream& stream, int64_t length, int64_t windows,
                              int64_t batch, torch::Device dev, Precision precision) {
  if (length < 1 || windows < 1 || batch < 1)
    throw std::invalid_argument("loss_by_position: length, windows and batch expected >= 1, got " +
                                std::to_string(length) + ", " + std::to_string(windows) + ", " + std::to_string(batch));
  if (stream.vocab() > model->config().vocab)
    throw std::invalid_argument("loss_by_position: the data's vocab " + std::to_string(stream.vocab()) +
                                " exceeds the model's " + std::to_string(model->config().vocab));
  const Batch all = even_windows(stream, windows, length + 1);  // on the CPU: [windows, length] each
  torch::NoGradGuard no_grad;
  AutocastGuard autocast(dev, precision);
  model->eval();
  auto sum = torch::zeros({length}, torch::kDouble);
  for (int64_t s = 0; s < windows; s += batch) {
    const int64_t n = std::min(batch, windows - s);
    auto input = all.input.narrow(0, s, n).to(dev), target = all.target.narrow(0, s, n).to(dev);
    auto logits = model->forward(input);  // [n, length, V] f32
    auto loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}),
                                             torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    sum += loss.reshape({n, length}).to(torch::kDouble).sum(0).cpu();
  }
  model->train();
  PositionLoss pl;
  pl.windows = windows;
  pl.sum.assign(sum.data_ptr<double>(), sum.data_ptr<double>() + length);
  return pl;
}

void write_position_csv(const PositionLoss& pl, int64_t bucket, const std::string& path) {
  if (bucket < 1) throw std::invalid_argument("bucket: expected >= 1, got " + std::to_string(bucket));
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write " + path);
  f.precision(8);
  f << "bucket_start,bucket_end,loss,ppl\n";
  const int64_t L = static_cast<int64_t>(pl.sum.size());
  for (int64_t b = 0; b < L; b += bucket) {
    const double m = pl.mean(b, b + bucket);
    f << b << "," << std::min(b + bucket, L) << "," << m << "," << std::exp(m) << "\n";
  }
}

}  // namespace pathattn::model
