// Pieces shared by the command-line programs (pathattn_train, pathattn_lm_eval, pathattn_generate; CLI11 mains).
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace pathattn::model {

// --device: "cpu" or "cuda" (which must be available).
inline torch::Device parse_device(const std::string& device) {
  if (device == "cuda") {
    if (!torch::cuda::is_available()) throw std::invalid_argument("--device cuda: no CUDA device available");
    return torch::kCUDA;
  }
  if (device != "cpu") throw std::invalid_argument("--device: expected cpu or cuda, got '" + device + "'");
  return torch::kCPU;
}

// --threads: n > 0, or 0 for all hardware threads.
inline void set_threads(int threads) {
  at::set_num_threads(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
}

// A number in JSON: 8 significant digits; NaN and infinities (which JSON lacks) as null.
inline std::string json_num(double x) {
  if (!std::isfinite(x)) return "null";
  std::ostringstream s;
  s.precision(8);
  s << x;
  return s.str();
}

}  // namespace pathattn::model
