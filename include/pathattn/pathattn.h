// pathattn: PaTH attention (softmax attention with a data-dependent product of Householder-like
// position transforms, Yang et al. 2025), torch-free C++ API.
//
// Every tensor crosses this API as a plain view (pointer, dtype, device, sizes, strides in elements).
// The caller allocates outputs (as FlashAttention's C++ API does); the library never allocates
// user-visible memory. Errors in the arguments throw pathattn::Error whose message names the
// argument and what was expected.
//
// Dimension vocabulary (used in every shape comment of the project):
//   B  batch, T sequence length, H key/value heads, HQ query heads (a multiple of H),
//   D  head dimension of q, k, w, DV head dimension of v and o, C chunk length.
//
// The math is in docs/math.md; equation numbers (Eq. n) in the sources refer to it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace pathattn {

// Thrown for invalid arguments and unsupported cases. The message names the argument.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Thrown when the device fails a valid call: a CUDA error (out of memory, a failed launch, a lost device). The
// message names the CUDA call or kernel, the CUDA error and the source line.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType { f16, bf16, f32, f64, i32 };
enum class Device { cpu, cuda };

const char* dtype_name(DType t);
std::size_t dtype_size(DType t);

// A strided view of at most 4 dimensions. Strides are in elements, as torch's.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int device_index = 0;
  int ndim = 0;
  int64_t sizes[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  // Optional tensors are absent when ndim == 0 (a default-constructed view).
  bool defined() const { return ndim > 0; }
  int64_t numel() const {
    int64_t n = ndim > 0 ? 1 : 0;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    return n;
  }
};

// Builds a contiguous (row-major) view.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes,
                     Device device = Device::cpu, int device_index = 0);

// Which implementation runs the op.
enum class Backend {
  automatic,  // cuda for CUDA tensors, the fast CPU path for CPU f32, the reference for f64
  reference,  // src/ref: the recurrence of docs/spec.md §1, O(T^2 D) time, O(T^2 D) memory in backward
  cpu,        // src/cpu: the chunked algorithm, f32
  cuda,       // src/cuda: Hopper kernels
};
const char* backend_name(Backend b);

// Inputs of the op. Optional tensors are absent when they are default-constructed (ndim == 0).
struct Inputs {
  TensorView q;           // [B, T, HQ, D]
  TensorView k;           // [B, T, H, D]
  TensorView v;           // [B, T, H, DV]
  TensorView w;           // [B, T, H, D]   unit norm (not renormalised here)
  TensorView beta;        // [B, T, H]      in [0, 2]
  TensorView g;           // [B, T, HQ]     optional log forget gate (<= 0); absent: PaTH, present: PaTH-FoX
  TensorView cu_seqlens;  // [N + 1] int32  optional packed varlen batch, requires B == 1
  std::optional<double> scale;  // default D^-0.5
  // CUDA backend: the cudaStream_t that kernels and copies are ordered on (null: the legacy default stream). The
  // call returns once the kernels are queued; reading o means synchronising with this stream. Not capturable in
  // a CUDA graph (the call uploads its chunk tables from the host; with cu_seqlens it also reads them back).
  void* cuda_stream = nullptr;
  // CUDA backward: sum every cross-block gradient contribution in one fixed order, so that two calls on the same
  // inputs give the same bits (the default). false lets the blocks add in whatever order they finish (f32
  // atomics): faster where the ordering waits, and different in the last bits from run to run.
  bool deterministic = true;
  // CUDA backend: also check the values of beta (in [0, 2]) and g (finite, <= 0), none NaN, before the kernels run,
  // throwing Error naming the first bad element as the CPU path does. Off by default: the check reads a flag back
  // to the host, which synchronises cuda_stream (~20 us, and not capturable in a CUDA graph); out-of-range values
  // otherwise give silent garbage. PATHATTN_CHECK_VALUES=1 in the environment turns it on for every call (e.g.
  // from Python). CPU tensors are always checked.
  bool check_values = false;
  // CUDA backend: where a call's scratch memory comes from. Given, it is called once per head slice of the call
  // (one slice unless cuda_workspace_limit cuts it) with the bytes needed and returns device memory (256-byte
  // aligned, on q's device) that stays valid until the work queued on cuda_stream has finished; torch's caching
  // allocator on that stream gives exactly this. A block is used only by the work queued before the next request,
  // so an allocator that recycles in stream order may release the previous block at each request (the torch op
  // does: its peak is one slice's scratch). Absent, the library keeps one grow-only buffer per device.
  std::function<void*(std::size_t)> cuda_workspace;
  // CUDA forward and backward: the most scratch memory one call should take, in bytes (0: no limit). A call whose
  // scratch, which grows with B x T x H (the backward's about 28 bytes per element of q at D = 64), would exceed it
  // runs over groups of kv heads in turn, each group within the limit: a few more launches, the same results
  // bit for bit (the heads are independent). What does not shrink with the heads (the backward's per-CTA
  // slots: C x D 16-bit values per chunk of the longest sequence, 0.55 GB at T = 16384, D = 64 on 132 SMs) stays,
  // so a limit below it is exceeded.
  // PATHATTN_CUDA_WORKSPACE_MB in the environment overrides it for every call (0: no limit). docs/cuda.md,
  // "Workspace limit": 1 GiB by default, which takes the backward's scratch at B = 8, T = 16384, H = 32, D = 64
  // from 7.0 to 0.96 GB for 7% of its time (measured on an H100, twenty-seventh session; 0, no limit, is the fastest).
  std::size_t cuda_workspace_limit = std::size_t{1} << 30;
};

struct ForwardOutputs {
  TensorView o;       // [B, T, HQ, DV]
  TensorView lse;     // [B, T, HQ] f32, natural log
  TensorView kcache;  // [B, T, H, D] optional: every key carried to the end of its sequence (docs/spec.md §4)
};

struct Gradients {
  TensorView dq;     // [B, T, HQ, D]
  TensorView dk;     // [B, T, H, D]
  TensorView dv;     // [B, T, H, DV]
  TensorView dw;     // [B, T, H, D]
  TensorView dbeta;  // [B, T, H]
  TensorView dg;     // [B, T, HQ]   required iff inputs.g is present
};

// Answer of supports(): ok, or the reason a case is not supported by a backend.
struct Support {
  bool ok = true;
  std::string reason;
  explicit operator bool() const { return ok; }
};

// Checks shapes, dtypes, devices and ranges (see docs/api.md); throws Error naming the argument.
// Value checks (NaN or out-of-range beta and g, cu_seqlens order) read memory and run here for CPU tensors only;
// on CUDA, forward / backward / decode check beta and g when Inputs::check_values (or PATHATTN_CHECK_VALUES=1) asks.
void check_inputs(const Inputs& in);

// The operations a backend may implement (one row of tests/test_backend_ops.cpp each).
enum class Op { forward, backward, decode };
const char* op_name(Op op);

// The head dimensions the CUDA kernels take (with DV == D; supports() gives the full rule). The CPU paths take any.
constexpr bool cuda_head_dim_supported(int64_t D) { return D == 64 || D == 128; }

// Whether `backend` can run `op` on this case, and if not, why (dtype, head dimension, device, an operation the
// backend does not implement...).
Support supports(const Inputs& in, Backend backend, Op op);
// The same for the forward, or the backward when `backward`.
Support supports(const Inputs& in, Backend backend, bool backward = false);

// o, lse (and kcache if given) for the inputs. Throws Error on bad input or unsupported case.
void forward(const Inputs& in, const ForwardOutputs& out, Backend backend = Backend::automatic);

// Gradients given the forward's o and lse and the output gradient do [B, T, HQ, DV].
void backward(const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const Gradients& grads, Backend backend = Backend::automatic);
// The same for a loss that also uses lse: dlse [B, T, HQ] in lse's dtype (absent: zero). Since d lse_i / d l_ij
// = P_ij, it enters as delta_i = dO_i . O_i - dlse_i (docs/math.md Eq. 6); e.g. merging attention over key blocks.
void backward(const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const TensorView& dlse, const Gradients& grads, Backend backend = Backend::automatic);

// Decoding (docs/spec.md §4, docs/math.md Eq. 3, 17): the key cache of B sequences, owned by the caller.
struct DecodeCache {
  TensorView k;        // [B, Tmax, H, D] f32 (CUDA: or bf16)  rows [0, len): every key carried to its sequence's
                       // last token; a bf16 cache is rounded at every step's carry (docs/cuda.md "Decode": its drift)
  TensorView v;        // [B, Tmax, H, DV] f32 (CUDA: or v's dtype, which stores the values exactly)
  TensorView gcum;     // [B, Tmax, HQ] f32 or f64  cumulative gates G_j; required iff the inputs have g
                       // (f64 keeps G_i - G_j exact at long T, docs/spec.md §6)
  TensorView lengths;  // [B] int32  tokens in the cache per sequence; decode() adds S. On the CPU for the CPU op, on
                       // q's device for the CUDA op (its kernels read and advance it: a step can be graph-captured)
  // Optional: the checkpointed cache (docs/spec.md §4, docs/math.md Eq. 35-37), ckpt and carry together. Rows
  // [0, ckpt[b]) hold keys carried only to token ckpt[b] - 1 and are read, not rewritten, at each token: the query
  // is carried back instead by the product of the pending tokens' factors, carry = H_ckpt ... H_{lengths - 1},
  // kept up to date (one D x D update per token). Rows [ckpt[b], lengths[b]) are carried to the last token as in
  // the plain cache. When ckpt_period tokens are pending, the old rows are carried by the product at once and
  // ckpt[b] becomes lengths[b]: one rewrite of the old rows per ckpt_period tokens. CPU and CUDA.
  TensorView ckpt;             // [B] int32, with lengths: 0 <= lengths[b] - ckpt[b] < ckpt_period
  TensorView carry;            // [B, H, D, D] f32, carry[b, h, d, e] = (H_ckpt ... H_{lengths-1})_{de} while
                               // lengths[b] > ckpt[b]; ignored (taken as the identity) when nothing is pending
  int64_t ckpt_period = 0;     // P >= 1 when ckpt is given
};

// Appends S new tokens per sequence (`in` with T = S, no cu_seqlens) to `cache` and writes their o [B, S, HQ, DV]
// and lse [B, S, HQ] (out.kcache unused). S = 1 is one decoding step; S > 1 (speculative decoding, chunked prefill
// on a cache) carries the cache with one UT factor per 64 tokens instead of S rank-one updates. Equal, to
// rounding, to forward() over the longer sequence. A prefill continues from forward()'s kcache with v and G copied.
// CPU: float32. CUDA: bf16 / f16 inputs, D = DV in {64, 128}, the cache as above with lengths on the device; there a
// sequence whose lengths[b] + S exceeds Tmax gets NaN o and lse and is left untouched (docs/cuda.md "Decode").
// commit = false (speculative decoding's verification): the same o and lse, but the cache and lengths are left as
// they were, since a PaTH cache cannot be rolled back (H_t is singular at beta_t = 1); decode the accepted tokens
// again with commit = true. The plain cache only; on CUDA at most 64 tokens (one pass over the cache).
void decode(const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out, Backend backend = Backend::automatic,
            bool commit = true);

// The PaTH layer's Householder directions from its w projection (docs/math.md Eq. 44-46), fused: a causal
// depthwise convolution over time, SiLU, and an L2 normalisation over each head's D channels,
//   y[b, t, c] = sum_{j < K} weight[c, j] x[b, t - K + 1 + j, c],   w[b, t, h, :] = a / max(|a|, eps), a = silu(y),
// where x is u preceded by `state` (the K - 1 inputs before u's first row; absent: zeros) or, with cu_seqlens, by
// zeros at each sequence's start. fla's ShortConvolution (no bias, SiLU) followed by l2_norm, in one pass over u
// instead of the ~20 element-wise passes of that composition. f32 arithmetic for 16-bit u (f64 for f64 u).
struct ShortConvW {
  TensorView u;           // [B, T, C] f32, bf16 or f16 (CPU: f32 or f64), C = H * head_dim
  TensorView weight;      // [C, K] f32, or u's dtype (the conv1d weight [C, 1, K] without its middle dimension)
  TensorView state;       // [B, K - 1, C] optional, u's dtype: the inputs before u's first row (decoding)
  TensorView cu_seqlens;  // [N + 1] int32 optional packed batch (B == 1, no state): the convolution restarts at
                          // each sequence's first row
  int64_t head_dim = 0;   // D: the channels normalised together (C a multiple of it)
  double eps = 1e-12;     // F.normalize's: a / max(|a|, eps)
  void* cuda_stream = nullptr;                   // as Inputs::cuda_stream
  std::function<void*(std::size_t)> cuda_workspace;  // as Inputs::cuda_workspace (the backward's weight partials)
};

// w [B, T, C / head_dim, head_dim], f32 (f64 for f64 u). CPU or CUDA, on u's device (Backend::automatic).
void short_conv_w(const ShortConvW& in, const TensorView& w, Backend backend = Backend::automatic);
// Gradients given dw (w's shape, f32 or f64): du (u's shape and dtype), dweight ([C, K], f32 or f64: summed over
// b and t in one fixed order, the same bits on every run), dstate (optional, [B, K - 1, C], u's dtype; requires
// state).
void short_conv_w_backward(const ShortConvW& in, const TensorView& dw, const TensorView& du,
                           const TensorView& dweight, const TensorView& dstate = TensorView(),
                           Backend backend = Backend::automatic);

// The rotary position embedding's rotation (RoPE), fused: with half = D / 2, x1 = x[..., :half], x2 = x[..., half:]
// and the angle tables cos, sin [T, half],
//   out[..., :half] = x1 cos - x2 sin,   out[..., half:] = x1 sin + x2 cos           (inverse = false)
//   out[..., :half] = x1 cos + x2 sin,   out[..., half:] = x2 cos - x1 sin           (inverse = true: the transpose,
//                                                                                      which is the backward)
// over x [B, T, H, D]. Each product is rounded to f32 (f64 for f64 x) before the sum, with no fused multiply-add,
// and the result once to x's dtype: the same values, bit for bit, as the composed form (x's halves converted to f32,
// two products, a difference or a sum, a conversion back) and as its autograd backward, in one read and one write
// of x each way instead of ~20 passes. docs/model.md "RoPE".
struct RopeRotate {
  TensorView x;    // [B, T, H, D] CUDA: f32, bf16 or f16; CPU: f32 or f64. D even; rows of D contiguous
  TensorView cos;  // [T, D / 2] f32 (f64 for f64 x), contiguous rows
  TensorView sin;  // [T, D / 2], as cos
  bool inverse = false;
  void* cuda_stream = nullptr;  // as Inputs::cuda_stream
};
// out: x's shape and dtype, on x's device, rows of D contiguous, not overlapping x. CPU or CUDA (Backend::automatic).
void rope_rotate(const RopeRotate& in, const TensorView& out, Backend backend = Backend::automatic);

// Sets the number of threads the CPU paths use (0: all cores). Returns the previous value.
int set_num_threads(int n);
int num_threads();

}  // namespace pathattn
