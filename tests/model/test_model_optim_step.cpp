// The trainer's optimizer step on ATen's foreach kernels (model/optim_step.h) against torch's own: the same bits
// on the CPU (where the foreach ops run per tensor), through several steps, with parameters that skip steps, with
// the state handed back and forth between the two, and through train_step on a model. (The clipping's test, both
// ways, is test_model.cpp's ClipWithoutSyncIsTorchsClip.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "optim_step.h"
#include "test_util.h"
#include "trainer.h"

using namespace pathattn::model;
using namespace pathattn::model::test_util;

namespace {

std::vector<torch::Tensor> make_params(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> ps;
  for (auto shape : {std::vector<int64_t>{7, 5}, std::vector<int64_t>{13}, std::vector<int64_t>{2, 3, 4},
                     std::vector<int64_t>{6}})
    ps.push_back(torch::randn(shape).requires_grad_());
  return ps;
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Step s's gradients: parameter 3 gets none at steps 0 and 1 (its step count then lags the others': two bias
// corrections in one update), parameter 1 none at step 2.
void set_grads(std::vector<torch::Tensor>& ps, int s) {
  torch::manual_seed(100 + s);
  for (size_t i = 0; i < ps.size(); ++i) {
    const bool none = (i == 3 && s < 2) || (i == 1 && s == 2);
    ps[i].mutable_grad() = none ? torch::Tensor() : torch::randn(ps[i].sizes());
  }
}

torch::optim::AdamWOptions options() {
  return torch::optim::AdamWOptions(3e-2).betas({0.9, 0.98}).weight_decay(0.1).eps(1e-8);
}

void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ", parameter " << i;
}

// `steps` steps of torch's AdamW on one copy of the parameters and, on the other, the foreach step where
// foreach_at(s) says so (torch's otherwise), the two copies compared after every step; returns torch's copy.
template <typename F>
std::vector<torch::Tensor> compare_steps(uint64_t seed, int steps, F foreach_at) {
  auto a = make_params(seed), b = copies(a);
  torch::optim::AdamW oa(a, options()), ob(b, options());
  for (int s = 0; s < steps; ++s) {
    set_grads(a, s);
    set_grads(b, s);
    oa.step();
    if (foreach_at(s))
      adamw_step_foreach(ob);
    else
      ob.step();
    expect_same(a, b, "step " + std::to_string(s));
  }
  return a;
}

}  // namespace

TEST(OptimStep, AdamWForeachIsTorchsAdamW) {
  const auto a = compare_steps(1, 6, [](int) { return true; });
  // The parameters moved (a test of equality between two steps that did nothing would pass too).
  EXPECT_FALSE(torch::equal(a[0], make_params(1)[0]));
}

TEST(OptimStep, StateIsInterchangeableWithTorchsStep) {
  // Alternating the two steps on one optimizer equals torch's steps alone: the foreach step keeps torch's state.
  compare_steps(2, 5, [](int s) { return s % 2 == 0; });
}

TEST(OptimStep, AmsgradIsRefused) {
  auto a = make_params(3);
  torch::optim::AdamW opt(a, options().amsgrad(true));
  set_grads(a, 0);
  EXPECT_NE(error_of<std::invalid_argument>([&] { adamw_step_foreach(opt); }).find("amsgrad"), std::string::npos);
}

TEST(OptimStep, TrainStepForeachEqualsTorchsLoop) {
  // Three steps of a tiny PaTH model on flip-flop batches, the trainer's way with each optimizer step.
  TaskConfig tcfg;
  tcfg.flipflop.pairs = 16;
  const auto task = make_task(tcfg);
  std::vector<std::vector<torch::Tensor>> params;
  for (bool foreach : {true, false}) {
    torch::manual_seed(7);
    Transformer model(tiny(Mechanism::path, task->vocab()));
    TrainConfig cfg = short_train(3, 4, 8);
    cfg.foreach_step = foreach;
    torch::optim::AdamW opt(model->parameters(), adamw_options(cfg));
    for (int64_t s = 0; s < 3; ++s) train_step(model, opt, draw_batch(*task, cfg, s), cfg);
    params.push_back(model->parameters());
  }
  expect_same(params[0], params[1], "train_step");
}
