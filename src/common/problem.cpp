// Argument validation at the API boundary: every message names the argument and what was expected.
#include "common/problem.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "common/checks.h"

namespace pathattn {

std::string shape_str(const TensorView& t) {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < t.ndim; ++i) s << (i ? ", " : "") << t.sizes[i];
  s << "]";
  return s.str();
}

std::string shape_str(std::initializer_list<int64_t> sizes) {
  std::ostringstream s;
  s << "[";
  int i = 0;
  for (int64_t x : sizes) s << (i++ ? ", " : "") << x;
  s << "]";
  return s.str();
}

[[noreturn]] void fail(const std::string& msg) { throw Error("pathattn: " + msg); }

void check_shape(const TensorView& t, const char* name, const char* layout, std::initializer_list<int64_t> sizes) {
  bool ok = t.ndim == static_cast<int>(sizes.size());
  int i = 0;
  for (int64_t x : sizes) ok = ok && t.sizes[i++] == x;
  if (!ok)
    fail(std::string(name) + " must have shape " + layout + " = " + shape_str(sizes) + ", got " + shape_str(t));
}

std::string device_str(Device d, int index) {
  return std::string(d == Device::cuda ? "cuda" : "cpu") + ":" + std::to_string(index);
}

void check_same_device(const TensorView& t, const char* name, const TensorView& q, const char* q_name) {
  if (t.device != q.device || t.device_index != q.device_index)
    fail(std::string(name) + " must be on the same device as " + q_name + " (" + device_str(q.device, q.device_index) + "), got " +
         device_str(t.device, t.device_index));
}

void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype == d) return;
  std::string list;
  for (DType d : allowed) list += std::string(list.empty() ? "" : " or ") + dtype_name(d);
  fail(std::string(name) + " must have dtype " + list + ", got " + dtype_name(t.dtype));
}

void check_pointer(const TensorView& t, const char* name) {
  if (t.data == nullptr && t.numel() > 0) fail(std::string(name) + " has a null data pointer");
}

namespace {

// Reads every value of a [B, T, X] CPU view (f32 or f64) and checks lo <= x <= hi, not NaN.
void check_range(const TensorView& t, const char* name, double lo, double hi, const char* expected) {
  for (int64_t b = 0; b < t.sizes[0]; ++b)
    for (int64_t i = 0; i < t.sizes[1]; ++i)
      for (int64_t h = 0; h < t.sizes[2]; ++h) {
        double x = load(t, offset(t, b, i, h));
        if (!(x >= lo && x <= hi)) {
          std::ostringstream s;
          s << name << " must be " << expected << ", got " << x << " at [" << b << ", " << i << ", " << h << "]";
          fail(s.str());
        }
      }
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
  }
  return "?";
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f64: return 8;
  }
  return 0;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::automatic: return "automatic";
    case Backend::reference: return "reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes, Device device, int device_index) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  t.ndim = static_cast<int>(sizes.size());
  if (t.ndim < 1 || t.ndim > 4) throw Error("pathattn: make_view takes 1 to 4 sizes");
  int i = 0;
  for (int64_t x : sizes) t.sizes[i++] = x;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.sizes[d];
  }
  return t;
}

Problem make_problem(const Inputs& in, bool check_values) {
  const TensorView& q = in.q;
  if (q.ndim != 4) fail("q must have 4 dimensions [B, T, HQ, D], got " + std::to_string(q.ndim) + " " + shape_str(q));
  for (auto [t, name] : {std::pair{&in.k, "k"}, {&in.v, "v"}, {&in.w, "w"}})
    if (t->ndim != 4)
      fail(std::string(name) + " must have 4 dimensions [B, T, H, " + (t == &in.v ? "DV" : "D") + "], got " +
           std::to_string(t->ndim) + " " + shape_str(*t));
  if (in.beta.ndim != 3) fail("beta must have 3 dimensions [B, T, H], got " + shape_str(in.beta));

  Problem p;
  p.B = q.sizes[0];
  p.T = q.sizes[1];
  p.HQ = q.sizes[2];
  p.D = q.sizes[3];
  p.H = in.k.sizes[2];
  p.DV = in.v.sizes[3];
  p.device = q.device;
  p.device_index = q.device_index;
  p.dtype = q.dtype;
  p.has_gate = in.g.defined();
  p.varlen = in.cu_seqlens.defined();
  if (p.B < 0 || p.T < 0 || p.HQ < 1)
    fail("q must have sizes B >= 0, T >= 0, HQ >= 1 in [B, T, HQ, D], got " + shape_str(q));
  if (p.D < 1) fail("q's head dimension D must be at least 1, got " + std::to_string(p.D));
  if (p.DV < 1) fail("v's head dimension DV must be at least 1, got " + std::to_string(p.DV));
  if (p.H < 1) fail("k must have at least one head, got H = " + std::to_string(p.H));
  if (p.HQ % p.H != 0)
    fail("the number of query heads HQ = " + std::to_string(p.HQ) + " (q.size(2)) must be a multiple of the number of " +
         "kv heads H = " + std::to_string(p.H) + " (k.size(2))");
  p.group = p.HQ / p.H;

  check_shape(in.k, "k", "[B, T, H, D]", {p.B, p.T, p.H, p.D});
  check_shape(in.v, "v", "[B, T, H, DV]", {p.B, p.T, p.H, p.DV});
  check_shape(in.w, "w", "[B, T, H, D]", {p.B, p.T, p.H, p.D});
  check_shape(in.beta, "beta", "[B, T, H]", {p.B, p.T, p.H});
  if (p.has_gate) check_shape(in.g, "g", "[B, T, HQ]", {p.B, p.T, p.HQ});

  for (auto [t, name] : {std::pair{&in.k, "k"}, {&in.v, "v"}, {&in.w, "w"}, {&in.beta, "beta"}})
    check_same_device(*t, name, q);
  if (p.has_gate) check_same_device(in.g, "g", q);
  if (p.varlen) check_same_device(in.cu_seqlens, "cu_seqlens", q);

  if (q.device == Device::cpu) {
    // CPU: one floating dtype for every input: f32 (fast path) or f64 (references, gradcheck).
    check_dtype(q, "q", {DType::f32, DType::f64});
    const char* names[] = {"k", "v", "w", "beta", "g"};
    const TensorView* ts[] = {&in.k, &in.v, &in.w, &in.beta, &in.g};
    for (int i = 0; i < 5; ++i) {
      if (!ts[i]->defined()) continue;
      if (ts[i]->dtype != q.dtype)
        fail(std::string(names[i]) + " must have the dtype of q (" + dtype_name(q.dtype) + ") on the CPU, got " +
             dtype_name(ts[i]->dtype));
    }
  } else {
    // CUDA: q, k, v in bf16 or f16 (tensor-core operands); w f32 or bf16; beta, g f32 (docs/spec.md §2, §6).
    check_dtype(q, "q", {DType::bf16, DType::f16});
    if (in.k.dtype != q.dtype) fail(std::string("k must have the dtype of q (") + dtype_name(q.dtype) + "), got " + dtype_name(in.k.dtype));
    if (in.v.dtype != q.dtype) fail(std::string("v must have the dtype of q (") + dtype_name(q.dtype) + "), got " + dtype_name(in.v.dtype));
    check_dtype(in.w, "w", {DType::f32, DType::bf16});
    check_dtype(in.beta, "beta", {DType::f32});
    if (p.has_gate) check_dtype(in.g, "g", {DType::f32});
  }
  for (auto [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&in.w, "w"}, {&in.beta, "beta"}})
    check_pointer(*t, name);
  if (p.has_gate) check_pointer(in.g, "g");

  if (in.scale) {
    if (!std::isfinite(*in.scale) || *in.scale <= 0)
      fail("scale must be a finite positive number, got " + std::to_string(*in.scale));
    p.scale = *in.scale;
  } else {
    p.scale = 1.0 / std::sqrt(static_cast<double>(p.D));
  }

  if (p.varlen) {
    const TensorView& cu = in.cu_seqlens;
    if (cu.ndim != 1 || cu.sizes[0] < 2)
      fail("cu_seqlens must be a 1-D tensor [N + 1] with N >= 1, got shape " + shape_str(cu));
    check_dtype(cu, "cu_seqlens", {DType::i32});
    check_pointer(cu, "cu_seqlens");
    if (p.B != 1) fail("cu_seqlens (packed varlen batch) requires B == 1, got B = " + std::to_string(p.B));
    if (cu.device == Device::cpu) {
      const int32_t* c = static_cast<const int32_t*>(cu.data);
      const int64_t n = cu.sizes[0] - 1;
      check_cu_seqlens(c, n, cu.strides[0], p.T, "");
      auto at = [&](int64_t i) { return static_cast<int64_t>(c[i * cu.strides[0]]); };
      for (int64_t i = 0; i < n; ++i)
        if (at(i + 1) > at(i)) p.segments.push_back({0, at(i), at(i + 1) - at(i)});
    }
  } else {
    for (int64_t b = 0; b < p.B; ++b)
      if (p.T > 0) p.segments.push_back({b, 0, p.T});
  }

  if (check_values && q.device == Device::cpu) {
    check_range(in.beta, "beta", 0.0, 2.0, "in [0, 2] (not NaN)");
    if (p.has_gate) check_range(in.g, "g", -std::numeric_limits<double>::max(), 0.0,
                               "a finite log forget gate <= 0 (not NaN or -inf: G_i - G_j would be NaN)");
  }
  return p;
}

void check_view(const TensorView& t, const char* name, std::initializer_list<int64_t> sizes, DType dtype, Device device,
                int device_index, const char* device_of, bool written) {
  // Forward outputs and gradients are written; backward's o, lse and dout are read: name them accordingly.
  const std::string what = std::string(name) + (written ? " (output)" : " (backward input)");
  if (!t.defined()) fail(what + " is required but was not given");
  bool ok = t.ndim == static_cast<int>(sizes.size());
  int i = 0;
  for (int64_t x : sizes) ok = ok && t.sizes[i++] == x;
  if (!ok) fail(what + " must have shape " + shape_str(sizes) + ", got " + shape_str(t));
  // A broadcast view (torch's expand) as an output would have threads write the same elements; an empty view has
  // none (make_view gives it zero strides).
  for (int d = 0; written && t.numel() > 0 && d < t.ndim; ++d)
    if (t.sizes[d] > 1 && t.strides[d] == 0)
      fail(what + " must not be a broadcast view: stride 0 in dimension " + std::to_string(d) + " of shape " +
           shape_str(t) + " makes its elements overlap");
  if (t.dtype != dtype) fail(what + " must have dtype " + dtype_name(dtype) + ", got " + dtype_name(t.dtype));
  if (t.device != device || t.device_index != device_index)
    fail(what + " must be on the device of " + device_of + " (" + device_str(device, device_index) + "), got " +
         device_str(t.device, t.device_index));
  check_pointer(t, name);
}

void check_cu_seqlens(const int32_t* c, int64_t n, int64_t stride, int64_t T, const char* T_of) {
  auto at = [&](int64_t i) { return static_cast<int64_t>(c[i * stride]); };
  if (at(0) != 0) fail("cu_seqlens[0] must be 0, got " + std::to_string(at(0)));
  for (int64_t i = 0; i < n; ++i)
    if (at(i + 1) < at(i))
      fail("cu_seqlens must be non-decreasing, got cu_seqlens[" + std::to_string(i + 1) + "] = " +
           std::to_string(at(i + 1)) + " < cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(at(i)));
  if (at(n) != T)
    fail("cu_seqlens[-1] must equal the packed length T = " + std::to_string(T) + T_of + ", got " + std::to_string(at(n)));
}

void check_output(const TensorView& t, const char* name, std::initializer_list<int64_t> sizes, DType dtype,
                  const Problem& p, bool written) {
  check_view(t, name, sizes, dtype, p.device, p.device_index, "q", written);
}

namespace {

// The bytes [lo, hi) a view can touch; empty (lo == hi) for an absent or zero-size view.
struct Span {
  uintptr_t lo = 0, hi = 0;
};
Span span_of(const TensorView& t) {
  if (!t.defined() || t.data == nullptr) return {};
  intptr_t lo = 0, hi = 0;  // element offsets of the extreme elements
  for (int d = 0; d < t.ndim; ++d) {
    if (t.sizes[d] == 0) return {};
    const intptr_t ext = static_cast<intptr_t>((t.sizes[d] - 1) * t.strides[d]);
    (ext < 0 ? lo : hi) += ext;
  }
  const intptr_t es = static_cast<intptr_t>(dtype_size(t.dtype));
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  return {base + static_cast<uintptr_t>(lo * es), base + static_cast<uintptr_t>((hi + 1) * es)};
}
bool overlap(const Span& a, const Span& b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }

}  // namespace

void check_disjoint(const std::vector<Named>& written, const std::vector<Named>& read) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    const Span sw = span_of(*w->view);
    for (auto o = w + 1; o != written.end(); ++o)
      if (overlap(sw, span_of(*o->view)))
        fail(std::string(w->name) + " (output) and " + o->name +
             " (output) share memory: each output needs its own storage");
    for (const Named& r : read)
      if (overlap(sw, span_of(*r.view)))
        fail(std::string(w->name) + " (output) shares memory with " + r.name +
             ": outputs must not alias the inputs (the kernels read inputs while writing outputs)");
  }
}

}  // namespace pathattn
