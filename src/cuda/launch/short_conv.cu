// The CUDA backend of short_conv_w / short_conv_w_backward (pathattn.h; kernels/short_conv.cuh): parameters from
// the validated views, the dtype and channels-per-lane dispatch, the weight partials' scratch.
#include <algorithm>
#include <vector>

#include "common/env.h"
#include "common/short_conv.h"
#include "cuda/check.h"
#include "cuda/kernels/short_conv.cuh"
#include "cuda/plan.h"
#include "cuda/workspace.h"

namespace pathattn::cuda {
namespace {

ShortConvParams make_params(const ConvProblem& pr, const ShortConvW& in) {
  ShortConvParams p{};
  p.u = in.u.data;
  p.u_b = in.u.strides[0], p.u_t = in.u.strides[1], p.u_c = in.u.strides[2];
  p.weight = in.weight.data;
  p.wt_c = in.weight.strides[0], p.wt_k = in.weight.strides[1];
  if (pr.has_state) {
    p.state = in.state.data;
    p.st_b = in.state.strides[0], p.st_t = in.state.strides[1], p.st_c = in.state.strides[2];
  }
  p.B = static_cast<int>(pr.B), p.T = static_cast<int>(pr.T), p.C = static_cast<int>(pr.C);
  p.K = static_cast<int>(pr.K), p.H = static_cast<int>(pr.H), p.D = static_cast<int>(pr.D);
  p.tiles = std::max(1, (p.T + kConvTile - 1) / kConvTile);
  p.eps = static_cast<float>(pr.eps);
  return p;
}

// cu_seqlens: its values checked on the host (one small copy, which synchronises the stream, as the attention
// op's varlen calls do), then read by the kernels from the device.
void set_varlen(ShortConvParams& p, ConvProblem& pr, const ShortConvW& in, cudaStream_t stream) {
  if (!pr.varlen) return;
  const TensorView& cu = in.cu_seqlens;
  const std::vector<int32_t> host = cu_seqlens_to_host(cu, stream);
  const int64_t n = static_cast<int64_t>(host.size()) - 1;
  set_seq_starts(pr, host.data(), n, 1);
  p.cu = static_cast<const int32_t*>(cu.data);
  p.cu_stride = cu.strides[0];
  p.num_seqs = static_cast<int>(n);
}

// The kernel instance (forward or backward) for u's and weight's dtypes, ceil(D / 32) channels per lane, and the
// sliding-window form (kWindow: D <= 128; at D = 256 its 128 window and tap registers per lane would spill).
template <bool kBwd, typename U, typename Wt, int NPL, bool kWindow>
void* kernel_of() {
  return kBwd ? reinterpret_cast<void*>(short_conv_w_bwd_kernel<U, Wt, NPL, kWindow>)
              : reinterpret_cast<void*>(short_conv_w_fwd_kernel<U, Wt, NPL, kWindow>);
}
template <bool kBwd, typename U, typename Wt>
void* by_lanes(int D, bool window) {
  if (D <= 32) return window ? kernel_of<kBwd, U, Wt, 1, true>() : kernel_of<kBwd, U, Wt, 1, false>();
  if (D <= 64) return window ? kernel_of<kBwd, U, Wt, 2, true>() : kernel_of<kBwd, U, Wt, 2, false>();
  if (D <= 128) return window ? kernel_of<kBwd, U, Wt, 4, true>() : kernel_of<kBwd, U, Wt, 4, false>();
  return kernel_of<kBwd, U, Wt, 8, false>();
}
template <bool kBwd, typename U>
void* by_weight(DType wt, int D, bool window) {
  return wt == DType::f32 ? by_lanes<kBwd, U, float>(D, window) : by_lanes<kBwd, U, U>(D, window);
}
template <bool kBwd>
void* pick(DType u, DType wt, int D, bool window) {
  switch (u) {
    case DType::bf16: return by_weight<kBwd, __nv_bfloat16>(wt, D, window);
    case DType::f16: return by_weight<kBwd, __half>(wt, D, window);
    default: return by_lanes<kBwd, float, float>(D, window);
  }
}

// PATHATTN_SHORT_CONV=window: the sliding-window kernels (kernels/short_conv.cuh ConvWindow; written after the
// device time was spent, so opt-in until measured: docs/perf/notes.md); rows (default): a row per warp.
bool use_window(int D) {
  static const bool on = env::choice("PATHATTN_SHORT_CONV", {"rows", "window"}, "rows") == "window";
  return on && D <= 128;
}

void launch(void* kernel, dim3 grid, int smem, ShortConvParams& p, cudaStream_t stream, const char* name) {
  if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  void* args[] = {&p};
  CUDA_CHECK(cudaLaunchKernel(kernel, grid, dim3(kConvThreads), args, static_cast<std::size_t>(smem), stream));
  CUDA_CHECK_LAUNCH(name);
}

}  // namespace

void short_conv_w(const ConvProblem& pr_in, const ShortConvW& in, const TensorView& w) {
  DeviceGuard guard(in.u.device_index);
  cudaStream_t stream = static_cast<cudaStream_t>(in.cuda_stream);
  ConvProblem pr = pr_in;
  ShortConvParams p = make_params(pr, in);
  set_varlen(p, pr, in, stream);
  p.w = static_cast<float*>(w.data);
  p.w_b = w.strides[0], p.w_t = w.strides[1], p.w_h = w.strides[2], p.w_d = w.strides[3];
  if (pr.B == 0 || pr.T == 0) return;
  const bool window = use_window(p.D);
  const int rows_per_cta = window ? kConvWarpRows * (kConvThreads / 32) : kConvRowsFwd;
  const dim3 grid((p.T + rows_per_cta - 1) / rows_per_cta, p.H, p.B);
  launch(pick<false>(in.u.dtype, in.weight.dtype, p.D, window), grid, 0, p, stream, "short_conv_w_fwd_kernel");
}

void short_conv_w_backward(const ConvProblem& pr_in, const ShortConvW& in, const TensorView& dw, const TensorView& du,
                           const TensorView& dweight, const TensorView& dstate) {
  DeviceGuard guard(in.u.device_index);
  cudaStream_t stream = static_cast<cudaStream_t>(in.cuda_stream);
  ConvProblem pr = pr_in;
  ShortConvParams p = make_params(pr, in);
  set_varlen(p, pr, in, stream);
  p.dw = static_cast<const float*>(dw.data);
  p.dw_b = dw.strides[0], p.dw_t = dw.strides[1], p.dw_h = dw.strides[2], p.dw_d = dw.strides[3];
  p.du = du.data;
  p.du_b = du.strides[0], p.du_t = du.strides[1], p.du_c = du.strides[2];
  if (dstate.defined()) {
    p.dstate = dstate.data;
    p.ds_b = dstate.strides[0], p.ds_t = dstate.strides[1], p.ds_c = dstate.strides[2];
  }
  p.dweight = static_cast<float*>(dweight.data);
  p.dwt_c = dweight.strides[0], p.dwt_k = dweight.strides[1];

  Workspace ws;
  const int partial = ws.add("short_conv_partial", static_cast<std::size_t>(p.B) * p.tiles * p.C * p.K * sizeof(float));
  Inputs alloc;  // only its cuda_workspace is read
  alloc.cuda_workspace = in.cuda_workspace;
  ws.acquire(alloc, in.u.device_index, stream);
  p.partial = ws.ptr<float>(partial);
  // T = 0 still runs one tile per batch row: it writes dstate's zeros and zero partials.
  if (p.B > 0)
    launch(pick<true>(in.u.dtype, in.weight.dtype, p.D, use_window(p.D)), dim3(p.tiles, p.H, p.B),
           conv_bwd_smem_bytes(p.D, p.K), p, stream, "short_conv_w_bwd_kernel");
  const int n = p.C * p.K;
  launch(reinterpret_cast<void*>(&short_conv_w_dweight_kernel), dim3((n + kConvThreads - 1) / kConvThreads), 0, p, stream,
         "short_conv_w_dweight_kernel");
}

}  // namespace pathattn::cuda
