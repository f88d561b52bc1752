// One call of the op run as several calls over groups of heads, on views of the same tensors (docs/cuda.md,
// "Workspace limit"). Every head of PaTH attention is independent of the others except that GQA's query heads
// share their kv head, so kv heads [h0, h0 + n) with their query heads [h0 G, (h0 + n) G) form a call of their
// own. The CUDA backend uses it to keep a call's scratch memory, which grows with B x T x H, under a limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/problem.h"
#include "pathattn/pathattn.h"

namespace pathattn {

// kv heads [h0, h0 + n).
struct HeadSlice {
  int64_t h0 = 0;
  int64_t n = 0;
};

// [0, H) cut into slices of per_slice kv heads (the last one shorter when per_slice does not divide H).
std::vector<HeadSlice> head_slices(int64_t H, int64_t per_slice);

// The most kv heads per slice, in [1, H], whose scratch bytes(n) stay within limit (bytes must not decrease with
// n); H when limit is 0 (no limit) or H heads fit; 1 when not even one head fits (the call then needs more than
// the limit, which is a target, not a promise).
int64_t heads_per_slice(int64_t H, std::size_t limit, const std::function<std::size_t(int64_t)>& bytes);

// The view of heads [first, first + count) of dimension 2 (the head dimension of every tensor of the op: q, k, v,
// w, o, dout, the gradients [B, T, heads, D]; beta, g, lse, dlse [B, T, heads]). Absent views stay absent.
TensorView slice_heads(const TensorView& t, int64_t first, int64_t count);
inline TensorView slice_heads(const TensorView& t, const HeadSlice& s) { return slice_heads(t, s.h0, s.n); }

// The query heads of kv heads s, `group` per kv head: [s.h0 group, (s.h0 + s.n) group).
inline HeadSlice query_heads(const HeadSlice& s, int64_t group) { return {s.h0 * group, s.n * group}; }

// The problem, inputs, outputs and gradients of one slice (query heads: `group` per kv head).
Problem slice_problem(const Problem& p, const HeadSlice& s);
Inputs slice_inputs(const Inputs& in, const HeadSlice& s, int64_t group);
ForwardOutputs slice_outputs(const ForwardOutputs& out, const HeadSlice& s, int64_t group);
Gradients slice_gradients(const Gradients& g, const HeadSlice& s, int64_t group);

}  // namespace pathattn
