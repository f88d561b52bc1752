// torch::Tensor -> pathattn::TensorView, and the optional type of the op signatures.
// The only translation between torch and the torch-free core: dtype, device, sizes, strides (in elements).
#pragma once

#include <torch/types.h>
#include <torch/version.h>

#include <optional>
#include <string>

#include "pathattn/pathattn.h"

namespace pathattn::torch_ops {

// The registered kernels must name the optional type the dispatcher uses: c10::optional was its own type in
// torch 1.x and early 2.x and became an alias of std::optional later (2.4). 2.6+ is certainly std::optional.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
template <typename T>
using opt = std::optional<T>;
#else
template <typename T>
using opt = c10::optional<T>;
#endif

inline DType to_dtype(at::ScalarType s, const char* name) {
  switch (s) {
    case at::kHalf: return DType::f16;
    case at::kBFloat16: return DType::bf16;
    case at::kFloat: return DType::f32;
    case at::kDouble: return DType::f64;
    case at::kInt: return DType::i32;
    default: break;
  }
  TORCH_CHECK(false, "pathattn: ", name, " has dtype ", c10::toString(s),
              ", which pathattn does not take (float32/float64 on the CPU, bfloat16/float16 on CUDA, int32 for "
              "cu_seqlens)");
}

// A required tensor as a view. Rank 1..4 (a 0-d view would read as "absent" in the core).
inline TensorView to_view(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), "pathattn: ", name, " is required but was None/undefined");
  TORCH_CHECK(t.layout() == at::kStrided, "pathattn: ", name, " must be a strided (dense) tensor, got layout ",
              t.layout());
  TORCH_CHECK(t.dim() >= 1 && t.dim() <= 4, "pathattn: ", name, " must have 1 to 4 dimensions (see the shapes in ",
              "docs/python.md), got ", t.dim(), " dimensions ", t.sizes());
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "pathattn: ", name,
              " must be a CPU or CUDA tensor, got device ", t.device());
  TensorView v;
  v.data = t.data_ptr();
  v.dtype = to_dtype(t.scalar_type(), name);
  v.device = t.is_cuda() ? Device::cuda : Device::cpu;
  v.device_index = t.is_cuda() ? t.get_device() : 0;
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.sizes[i] = t.size(i);
    v.strides[i] = t.stride(i);
  }
  return v;
}

// An optional tensor: None (or undefined) -> the default view, which the core reads as absent.
inline TensorView to_view(const opt<at::Tensor>& t, const char* name) {
  if (!t.has_value() || !t->defined()) return TensorView{};
  return to_view(*t, name);
}

}  // namespace pathattn::torch_ops
