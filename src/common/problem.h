// The validated shape of one call, shared by every backend, and strided element access.
#pragma once

#include <functional>
#include <vector>

#include "pathattn/pathattn.h"

namespace pathattn {

// One independent sequence: rows [t0, t0 + len) of batch row b (varlen: b == 0, t0 from cu_seqlens).
struct Segment {
  int64_t b = 0;
  int64_t t0 = 0;
  int64_t len = 0;
};

struct Problem {
  int64_t B = 0, T = 0, H = 0, HQ = 0, D = 0, DV = 0;
  int64_t group = 1;  // HQ / H: query heads per kv head (GQA)
  double scale = 0;   // logit scale (default D^-0.5); the gate term is not scaled (docs/spec.md §1)
  bool has_gate = false;
  bool varlen = false;
  Device device = Device::cpu;
  int device_index = 0;
  DType dtype = DType::f32;  // dtype of q, k, v, o
  std::vector<Segment> segments;
};

// Validates `in` (throws Error naming the argument) and returns the problem's sizes.
// With check_values, also reads beta, g and cu_seqlens (CPU only) for NaN, range and order.
Problem make_problem(const Inputs& in, bool check_values);

// Checks that an output view has the expected shape, dtype and device; `written` views (not o, lse, dout read by
// the backward) must also not be broadcast views (stride 0), whose elements would be written by several threads.
void check_output(const TensorView& t, const char* name, std::initializer_list<int64_t> sizes, DType dtype,
                  const Problem& p, bool written = true);

// A view with its argument name, for check_disjoint.
struct Named {
  const TensorView* view;
  const char* name;
};

// Checks that no written view shares memory with a read view or with another written view (throws Error naming
// both). Conservative: views compare by the byte ranges they span, so two interleaved views of one buffer that
// never touch the same element are also refused.
void check_disjoint(const std::vector<Named>& written, const std::vector<Named>& read);

// Offset in elements of index (i0, i1, i2, i3) of a view (unused trailing indices are 0).
inline int64_t offset(const TensorView& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

// Element read/write with conversion, for CPU views of f32 or f64 (the CPU paths' dtypes).
inline double load(const TensorView& t, int64_t off) {
  return t.dtype == DType::f64 ? static_cast<const double*>(t.data)[off]
                               : static_cast<double>(static_cast<const float*>(t.data)[off]);
}
inline void store(const TensorView& t, int64_t off, double x) {
  if (t.dtype == DType::f64)
    static_cast<double*>(t.data)[off] = x;
  else
    static_cast<float*>(t.data)[off] = static_cast<float>(x);
}

// Runs fn(i) for i in [0, n) on the CPU thread pool (OpenMP), each index once.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace pathattn
