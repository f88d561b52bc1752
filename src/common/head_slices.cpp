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
  const HeadSlice qs = query_heads(s, group);
  out.q = slice_heads(in.q, qs);
  out.g = slice_heads(in.g, qs);
  out.k = slice_heads(in.k, s);
  out.v = slice_heads(in.v, s);
  out.w = slice_heads(in.w, s);
  out.beta = slice_heads(in.beta, s);
  return out;
}

ForwardOutputs slice_outputs(const ForwardOutputs& o, const HeadSlice& s, int64_t group) {
  const HeadSlice qs = query_heads(s, group);
  return ForwardOutputs{slice_heads(o.o, qs), slice_heads(o.lse, qs), slice_heads(o.kcache, s)};
}

Gradients slice_gradients(const Gradients& g, const HeadSlice& s, int64_t group) {
  const HeadSlice qs = query_heads(s, group);
  return Gradients{slice_heads(g.dq, qs), slice_heads(g.dk, s),    slice_heads(g.dv, s),
                   slice_heads(g.dw, s),  slice_heads(g.dbeta, s), slice_heads(g.dg, qs)};
}

}  // namespace pathattn
