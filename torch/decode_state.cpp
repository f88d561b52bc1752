// The decoding state of pathattn_torch.h (docs/spec.md §4): DecodeState (a caller-owned key cache: empty, from a prefill,
// grown) and decode(), which appends S tokens per sequence through the pathattn::decode op. The state lives on one
// device: the CPU (the CPU decode, float32) or a CUDA device (the CUDA decode kernels, whose lengths must be an int32
// tensor on that device: they read and advance it).
#include <torch/autograd.h>

#include <algorithm>

#include "pathattn_ops.h"
#include "pathattn_torch.h"

namespace pathattn {

using at::Tensor;
using torch_ops::to_opt;
using torch_ops::to_opt_scale;

DecodeState DecodeState::empty(int64_t B, int64_t Tmax, int64_t H, int64_t HQ, int64_t D, int64_t DV, bool gated,
                               torch::Device device, int64_t checkpoint) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  DecodeState s;
  s.k = torch::zeros({B, Tmax, H, D}, f32);
  s.v = torch::zeros({B, Tmax, H, DV}, f32);
  if (gated) s.gcum = torch::zeros({B, Tmax, HQ}, f32.dtype(torch::kFloat64));
  s.lengths = torch::zeros({B}, f32.dtype(torch::kInt32));
  TORCH_CHECK(checkpoint >= 0, "pathattn: DecodeState: checkpoint (the refresh period) must be >= 0 (0: the plain "
              "cache), got ", checkpoint);
  if (checkpoint > 0) {
    s.ckpt = torch::zeros({B}, f32.dtype(torch::kInt32));
    s.carry = torch::eye(D, f32).expand({B, H, D, D}).contiguous();  // nothing pending
    s.period = checkpoint;
  }
  return s;
}

DecodeState DecodeState::from_prefill(const Tensor& kcache, const Tensor& v, const Tensor& g, int64_t Tmax,
                                      int64_t checkpoint) {
  TORCH_CHECK(kcache.defined() && v.defined(), "pathattn: from_prefill: kcache and v are required");
  TORCH_CHECK(kcache.dim() == 4 && v.dim() == 4, "pathattn: from_prefill: kcache [B, T, H, D] and v [B, T, H, DV] "
              "expected, got ", kcache.sizes(), " and ", v.sizes());
  const int64_t B = kcache.size(0), T = kcache.size(1);
  TORCH_CHECK(v.size(0) == B && v.size(1) == T && v.size(2) == kcache.size(2), "pathattn: from_prefill: v must be "
              "[B, T, H, DV] = [", B, ", ", T, ", ", kcache.size(2), ", DV], got ", v.sizes());
  TORCH_CHECK(Tmax >= T, "pathattn: from_prefill: Tmax = ", Tmax, " must hold the prefill's T = ", T, " tokens");
  TORCH_CHECK(!g.defined() || (g.dim() == 3 && g.size(0) == B && g.size(1) == T),
              "pathattn: from_prefill: g must be [B, T, HQ] = [", B, ", ", T, ", HQ], got ", g.sizes());
  // The cache is made on kcache's device; a v or g elsewhere would be copied across silently: refuse it instead.
  TORCH_CHECK(v.device() == kcache.device(), "pathattn: from_prefill: v must be on kcache's device (",
              kcache.device(), "), got ", v.device());
  TORCH_CHECK(!g.defined() || g.device() == kcache.device(), "pathattn: from_prefill: g must be on kcache's device (",
              kcache.device(), "), got ", g.device());
  DecodeState s = empty(B, Tmax, kcache.size(2), g.defined() ? g.size(2) : 1, kcache.size(3), v.size(3), g.defined(),
                        kcache.device(), checkpoint);
  s.k.narrow(1, 0, T).copy_(kcache);  // a bfloat16 kcache (the CUDA prefill's) widens exactly to f32
  s.v.narrow(1, 0, T).copy_(v);
  if (g.defined()) s.gcum.narrow(1, 0, T).copy_(g.to(torch::kFloat64).cumsum(1));  // G_t, docs/spec.md §6: in f64
  s.lengths.fill_(static_cast<int32_t>(T));
  if (s.ckpt.defined()) s.ckpt.fill_(static_cast<int32_t>(T));  // the prefill's keys: carried to the checkpoint
  return s;
}

void DecodeState::reserve(int64_t n) {
  TORCH_CHECK(k.defined() && lengths.defined(), "pathattn: DecodeState::reserve: the state is empty (use "
              "DecodeState::empty or from_prefill)");
  // The longest sequence, read to the host: for a CUDA state this waits for the work queued on the current stream
  // (the kernels advance lengths on the device). Callers that count their tokens call this only when Tmax would be
  // exceeded (model/path_op.cpp); CUDA-graph users allocate the room before capturing.
  const int64_t Tmax = k.size(1), need = lengths.max().item<int64_t>() + n;
  if (need <= Tmax) return;
  const int64_t T2 = std::max(2 * Tmax, need);
  auto grow = [&](const Tensor& t) {
    if (!t.defined()) return t;
    auto sizes = t.sizes().vec();
    sizes[1] = T2;
    Tensor g2 = torch::zeros(sizes, t.options());  // on t's device
    g2.narrow(1, 0, Tmax).copy_(t);
    return g2;
  };
  k = grow(k);
  v = grow(v);
  gcum = grow(gcum);
}

DecodeOutput decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, const Tensor& beta,
                    DecodeState& state, const std::optional<Tensor>& g, std::optional<double> scale, bool commit) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(state.k.defined() && state.v.defined() && state.lengths.defined(),
              "pathattn: decode: the DecodeState is empty (use DecodeState::empty or from_prefill)");
  auto [o, lse] = torch_ops::call_decode(q, k, v, w, beta, to_opt(g), to_opt_scale(scale), state.k, state.v,
                                         to_opt(state.gcum), state.lengths, to_opt(state.ckpt), to_opt(state.carry),
                                         state.period, commit);
  return {o, lse};
}

}  // namespace pathattn
