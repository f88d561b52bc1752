// Helpers shared by the model's gtest suites: a small model config, a scratch folder, the message of an exception.
#pragma once

#include <unistd.h>

#include <exception>
#include <filesystem>
#include <string>

#include "config.h"
#include "dir_ops.h"
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

}  // namespace pathattn::model::test_util
