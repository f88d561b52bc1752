#include "precision.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <stdexcept>

namespace pathattn::model {

namespace {

// torch 2.4 made autocast's state per device type (set_autocast_enabled(type, on), ...) and deprecated the
// CUDA-only / CPU-only functions that torch 1.13 (Debian) has.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_on(torch::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
void set_autocast_on(torch::DeviceType t, bool on) { at::autocast::set_autocast_enabled(t, on); }
torch::ScalarType autocast_dtype(torch::DeviceType t) { return at::autocast::get_autocast_dtype(t); }
void set_autocast_dtype(torch::DeviceType t, torch::ScalarType d) { at::autocast::set_autocast_dtype(t, d); }
#else
bool autocast_on(torch::DeviceType t) {
  return t == torch::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_autocast_on(torch::DeviceType t, bool on) {
  if (t == torch::kCUDA) at::autocast::set_enabled(on);
  else at::autocast::set_cpu_enabled(on);
}
torch::ScalarType autocast_dtype(torch::DeviceType t) {
  return t == torch::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void set_autocast_dtype(torch::DeviceType t, torch::ScalarType d) {
  if (t == torch::kCUDA) at::autocast::set_autocast_gpu_dtype(d);
  else at::autocast::set_autocast_cpu_dtype(d);
}
#endif

}  // namespace

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "f32"; }

Precision parse_precision(const std::string& s, torch::Device dev) {
  if (s == "f32") return Precision::f32;
  if (s == "bf16") return Precision::bf16;
  if (s == "auto") return dev.is_cuda() ? Precision::bf16 : Precision::f32;
  throw std::invalid_argument("precision: expected auto, f32 or bf16, got '" + s + "'");
}

AutocastGuard::AutocastGuard(torch::Device dev, Precision p) {
  if (p != Precision::bf16) return;
  if (!dev.is_cuda() && !dev.is_cpu())
    throw std::invalid_argument("precision bf16: autocast here covers cpu and cuda only");
  active_ = true;
  type_ = dev.type();
  prev_enabled_ = autocast_on(type_);
  prev_dtype_ = autocast_dtype(type_);
  set_autocast_on(type_, true);
  set_autocast_dtype(type_, torch::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // As torch.autocast's __exit__: the outermost exit drops the cached bf16 copies of the weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_on(type_, prev_enabled_);
  set_autocast_dtype(type_, prev_dtype_);
}

}  // namespace pathattn::model
