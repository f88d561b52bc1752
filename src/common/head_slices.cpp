#include "common/head_slices.h"

#include <algorithm>

namespace pathattn {

std::vector<HeadSlice> head_slices(int64_t H, int64_t per_slice) {
  if (per_slice < 1) throw Error("pathattn: head_slices: per_slice must be >= 1, got " + std::to_string(per_slice));
  std::vector<HeadSlice> out;
  for (int64_t h0 = 0; h0 < H; h0 += per_slice) out.push_back({h0, std::min(per_slice, H - h0)});
  return out;
}

int64_t heads_per_slice(int64_t H, std::size_t limit, const std::function<std::size_t(int64_t)>& bytes) {
  if (H <= 1 || limit == 0 || bytes(H) <= limit) return std::max<int64_t>(H, 1);
  // Largest n with bytes(n) <= limit: lo fits (or is 1), hi does not.
  int64_t lo = 1, hi = H;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (bytes(mid) <= limit ? lo : hi) = mid;
  }
  return lo;
}

TensorView slice_heads(const TensorView& t, int64_t first, int64_t count) {
  if (!t.defined()) return t;
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + first * t.strides[2] * static_cast<int64_t>(dtype_size(t.dtype));
  s.sizes[2] = count;
  return s;
}

Problem slice_problem(const Problem& p, const HeadSlice& s) {
  Problem q = p;
  q.H = s.n;
  q.HQ = s.n * p.group;
  return q;
}

Inputs slice_inputs(const Inputs& in, const HeadSlice& s, int64_t group) {
  Inputs out = in;  // cu_seqlens, scale, stream, switches and the workspace callback as they are
  const int64_t q0 = s.h0 * group, nq = s.n * group;
  out.q = slice_heads(in.q, q0, nq);
  out.g = slice_heads(in.g, q0, nq);
  out.k = slice_heads(in.k, s.h0, s.n);
  out.v = slice_heads(in.v, s.h0, s.n);
  out.w = slice_heads(in.w, s.h0, s.n);
  out.beta = slice_heads(in.beta, s.h0, s.n);
  return out;
}

ForwardOutputs slice_outputs(const ForwardOutputs& o, const HeadSlice& s, int64_t group) {
  return ForwardOutputs{slice_heads(o.o, s.h0 * group, s.n * group), slice_heads(o.lse, s.h0 * group, s.n * group),
                        slice_heads(o.kcache, s.h0, s.n)};
}

Gradients slice_gradients(const Gradients& g, const HeadSlice& s, int64_t group) {
  const int64_t q0 = s.h0 * group, nq = s.n * group;
  return Gradients{slice_heads(g.dq, q0, nq),         slice_heads(g.dk, s.h0, s.n),
                   slice_heads(g.dv, s.h0, s.n),      slice_heads(g.dw, s.h0, s.n),
                   slice_heads(g.dbeta, s.h0, s.n),   slice_heads(g.dg, q0, nq)};
}

}  // namespace pathattn
