// Helpers shared by the model's gtest suites: a small model config, a scratch folder, the message of an exception.
#pragma once

#include <unistd.h>

#include <exception>
#include <filesystem>
#include <string>

#include "attention.h"
#include "config.h"
#include "dir_ops.h"
#include "pathattn_torch.h"
#include "trainer.h"

namespace pathattn::model::test_util {

// Two blocks of width 32 with two heads: small enough for a test, every part of the layer present.
inline ModelConfig tiny(Mechanism m, int64_t vocab = 11) {
  ModelConfig c;
  c.vocab = vocab;
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 2;
  c.mechanism = m;
  return c;
}

// A short, silent training run: `steps` steps of `batch` sequences, one warm-up step, no evaluation or logging on
// the way (the last step still evaluates eval_size sequences per set).
inline TrainConfig short_train(int64_t steps, int64_t batch, int64_t eval_size) {
  TrainConfig tc;
  tc.steps = steps;
  tc.batch = batch;
  tc.warmup = 1;
  tc.eval_every = 0;
  tc.eval_size = eval_size;
  tc.log_every = 0;
  return tc;
}

// A fresh, empty folder under the system's temporary directory, unique to this process.
inline std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("pathattn_model_test_" + name + "_" + std::to_string(::getpid()));
  pathattn::model::remove_tree(d);
  std::filesystem::create_directories(d);
  return d;
}

// The message of the exception of type E (or derived) that f throws ("" when it throws none). Another exception
// propagates: the test fails on it.
template <class E = std::exception, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// The fused RoPE rotation (pathattn::rope_rotate) against the composed form the model has always used
// (rope_rotate_composed): x [B, T, H, D] of x's dtype and device, the tables as the model makes them, an upstream
// gradient; returns "" when the outputs and the gradients of x are equal (torch::equal: the same values), else what
// differs and by how much.
inline std::string rope_fused_vs_composed(const torch::Tensor& x0, double base = 10000.0) {
  const auto [cos, sin] = rope_tables(x0, 0, base);
  auto xa = x0.detach().clone().requires_grad_(true), xb = x0.detach().clone().requires_grad_(true);
  const auto ya = pathattn::rope_rotate(xa, cos, sin), yb = rope_rotate_composed(xb, cos, sin);
  const auto g = torch::randn(ya.sizes(), torch::TensorOptions().device(x0.device())).to(x0.scalar_type());
  ya.backward(g);
  yb.backward(g);
  auto diff = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
  };
  if (ya.scalar_type() != x0.scalar_type()) return "the output's dtype is not x's";
  if (!torch::equal(ya, yb)) return "outputs differ by up to " + std::to_string(diff(ya, yb));
  if (!torch::equal(xa.grad(), xb.grad())) return "gradients differ by up to " + std::to_string(diff(xa.grad(), xb.grad()));
  return "";
}

}  // namespace pathattn::model::test_util
