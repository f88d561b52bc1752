// PaTH attention for libtorch C++ code: differentiable entry points over the pathattn::fwd / pathattn::bwd ops.
// Link the CMake target pathattn_torch. Shapes (docs/spec.md §2; B batch, T length, HQ query heads, H kv heads, D, DV):
//   q [B, T, HQ, D], k and w [B, T, H, D], v [B, T, H, DV], beta [B, T, H] in [0, 2], g [B, T, HQ] (log forget
//   gate <= 0, optional), cu_seqlens [N + 1] int32 with B == 1 (packed variable-length batch, optional).
// dtypes: CPU float32 (float64 runs the reference, for gradcheck); CUDA bfloat16/float16 q, k, v with f32 beta, g.
// Errors arrive as c10::Error whose message names the argument and what was expected.
#pragma once

#include <torch/types.h>

#include <optional>

namespace pathattn {

// o [B, T, HQ, DV], differentiable in q, k, v, w, beta, g. scale defaults to D^-0.5 (the gate is not scaled).
// deterministic: the CUDA backward sums across blocks in a fixed order (bitwise repeatable; measured 10-16% slower
// than the free order on the H200, docs/perf/notes.md); the CPU backward is always deterministic.
torch::Tensor path_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& w, const torch::Tensor& beta,
                             const std::optional<torch::Tensor>& g = std::nullopt,
                             std::optional<double> scale = std::nullopt,
                             const std::optional<torch::Tensor>& cu_seqlens = std::nullopt, bool deterministic = true);

// The PaTH layer's Householder directions from its w projection u [B, T, C] (C = H * head_dim), fused (docs/math.md
// Eq. 44-46): w = normalize(silu(causal depthwise conv(u, weight))) over each head's channels, [B, T, H, head_dim]
// f32 (f64 for f64 u); fla's ShortConvolution (SiLU, no bias) + l2_norm in one pass each way. weight [C, 1, K] (the
// conv1d weight) or [C, K]; state [B, K - 1, C] the inputs before u's first row (decoding; absent: zeros);
// cu_seqlens [N + 1] int32 with B == 1 restarts the convolution at each sequence. Differentiable in u, weight and
// state; CPU (float32/float64; 16-bit through float32) and CUDA (float32/bfloat16/float16, head_dim <= 256, K <= 8).
torch::Tensor short_conv_w(const torch::Tensor& u, const torch::Tensor& weight,
                           const std::optional<torch::Tensor>& state, const std::optional<torch::Tensor>& cu_seqlens,
                           int64_t head_dim, double eps = 1e-12);

// The rotary position embedding's rotation, fused (pathattn.h rope_rotate): with half = D / 2 and the angle tables
// cos, sin [T, half] (f32; f64 for f64 x), [x1 cos - x2 sin, x1 sin + x2 cos] over x [B, T, H, D], each product
// rounded before the sum and the result once to x's dtype: the same values, bit for bit, as the composition
// (x1.float() * cos - x2.float() * sin, ...).to(x.dtype) and as its autograd gradient, in one pass each way.
// Differentiable in x (the tables take no gradient); CUDA float32/bfloat16/float16, CPU float32/float64.
torch::Tensor rope_rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

struct PathAttentionOutput {
  torch::Tensor o;       // [B, T, HQ, DV], differentiable
  torch::Tensor lse;     // [B, T, HQ] f32 natural-log normaliser, differentiable too
  torch::Tensor kcache;  // [B, T, H, D] keys carried to the end of their sequence (docs/spec.md §4), no gradient;
                         // undefined unless with_kcache
};

PathAttentionOutput path_attention_ex(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& w, const torch::Tensor& beta,
                                      const std::optional<torch::Tensor>& g, std::optional<double> scale,
                                      const std::optional<torch::Tensor>& cu_seqlens, bool with_kcache,
                                      bool deterministic = true);

// Decoding state (docs/spec.md §4): the key cache of B sequences, owned by the caller, updated in place by decode().
// Its tensors live on one device, the device of the new tokens' q: CPU (the CPU decode: float32 inputs) or CUDA (the
// CUDA decode kernels: bfloat16/float16 q, k, v, float32 w, beta, g; D = DV in {64, 128}; docs/cuda.md "Decode").
// After a prefill, from_prefill() holds its kcache, v and gates on their device.
struct DecodeState {
  torch::Tensor k;        // [B, Tmax, H, D] f32   rows [0, len): keys carried to each sequence's last token
  torch::Tensor v;        // [B, Tmax, H, DV] f32
  torch::Tensor gcum;     // [B, Tmax, HQ] f64     cumulative log gates; undefined without a gate
  torch::Tensor lengths;  // [B] int32             cached tokens per sequence, on the cache's device (on CUDA the
                          //                       kernels read and advance it: no host work per step)
  // The checkpointed cache (docs/math.md Eq. 35-37; pathattn.h DecodeCache): undefined / 0 for the plain one.
  torch::Tensor ckpt;     // [B] int32             rows [0, ckpt) carried only to the checkpoint
  torch::Tensor carry;    // [B, H, D, D] f32      the pending tokens' product M (ignored when nothing is pending)
  int64_t period = 0;     //                       P: the old rows are carried by M every P tokens

  // An empty cache with room for Tmax tokens per sequence, on `device`.
  // checkpoint = P > 0: the checkpointed cache of that period (CPU and CUDA, docs/cuda.md).
  static DecodeState empty(int64_t B, int64_t Tmax, int64_t H, int64_t HQ, int64_t D, int64_t DV, bool gated,
                           torch::Device device = torch::kCPU, int64_t checkpoint = 0);
  // The cache after a prefill of T tokens (path_attention_ex(..., with_kcache = true)), with room for Tmax >= T, on
  // kcache's device (v and g must be there too): kcache [B, T, H, D] (any floating dtype, e.g. the CUDA prefill's
  // bfloat16; stored as f32), v [B, T, H, DV], g [B, T, HQ] or undefined.
  static DecodeState from_prefill(const torch::Tensor& kcache, const torch::Tensor& v, const torch::Tensor& g,
                                  int64_t Tmax, int64_t checkpoint = 0);
  // Room for n more tokens per sequence: Tmax doubles (or grows to fit) when the cache would overflow. It reads the
  // lengths to the host: on CUDA that synchronises with the current stream (and cannot be graph-captured); a caller
  // that knows the lengths (a model counting its tokens) calls it only when Tmax would be exceeded, and a CUDA-graph
  // user allocates the room beforehand (empty() / from_prefill() with a large Tmax).
  void reserve(int64_t n);
};

struct DecodeOutput {
  torch::Tensor o;    // [B, S, HQ, DV]
  torch::Tensor lse;  // [B, S, HQ] f32
};

// Appends S new tokens per sequence (q [B, S, HQ, D], k and w [B, S, H, D], v [B, S, H, DV], beta [B, S, H],
// g [B, S, HQ] iff the cache has gates) and attends them to the cache: equal to path_attention over the whole
// sequence, to rounding. The inputs are on the cache's device (a mismatch is a c10::Error naming the tensor). CUDA:
// on torch's current stream, reading nothing back to the host (scratch from torch's caching allocator); a call of
// S >= 4 tokens runs as one pass over the cache per 64 tokens, fewer as single steps; a sequence without room for
// them gets NaN o and lse and is left as it was (the CPU throws instead: call reserve() first). commit = false:
// the same o and lse with the state left as it was (speculative decoding: verify the draft tokens, then decode the
// accepted ones; the plain cache only, at most 64 tokens on CUDA). No gradients.
DecodeOutput decode(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& w,
                    const torch::Tensor& beta, DecodeState& state,
                    const std::optional<torch::Tensor>& g = std::nullopt, std::optional<double> scale = std::nullopt,
                    bool commit = true);

}  // namespace pathattn
