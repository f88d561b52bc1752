// The CUDA backend of short_conv_w / short_conv_w_backward (pathattn.h; kernels/short_conv.cuh): parameters from
// the validated views, the dtype and channels-per-lane dispatch, the weight partials' scratch.
#include <algorithm>
#include <vector>

#include "common/env.h"
#include "common/short_conv.h"
#include "cuda/check.h"
#include "cuda/kernels/short_conv.cuh"
#include "cuda/kernels/short_conv_vec.cuh"
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

// The row kernels' instance (forward or backward) for u's and weight's dtypes and ceil(D / 32) channels per lane.
template <bool kBwd, typename U, typename Wt, int NPL>
void* kernel_of() {
  return kBwd ? reinterpret_cast<void*>(short_conv_w_bwd_kernel<U, Wt, NPL>)
              : reinterpret_cast<void*>(short_conv_w_fwd_kernel<U, Wt, NPL>);
}
template <bool kBwd, typename U, typename Wt>
void* by_lanes(int D) {
  if (D <= 32) return kernel_of<kBwd, U, Wt, 1>();
  if (D <= 64) return kernel_of<kBwd, U, Wt, 2>();
  if (D <= 128) return kernel_of<kBwd, U, Wt, 4>();
  return kernel_of<kBwd, U, Wt, 8>();
}
// The vector form's (kernels/short_conv_vec.cuh) for D / 8 lanes per head.
template <bool kBwd, typename U, typename Wt, int DL>
void* vec_kernel_of() {
  return kBwd ? reinterpret_cast<void*>(short_conv_w_bwd_vec_kernel<U, Wt, DL>)
              : reinterpret_cast<void*>(short_conv_w_fwd_vec_kernel<U, Wt, DL>);
}
template <bool kBwd, typename U, typename Wt>
void* by_head_lanes(int D) {
  switch (D) {
    case 8: return vec_kernel_of<kBwd, U, Wt, 1>();
    case 16: return vec_kernel_of<kBwd, U, Wt, 2>();
    case 32: return vec_kernel_of<kBwd, U, Wt, 4>();
    case 64: return vec_kernel_of<kBwd, U, Wt, 8>();
    case 128: return vec_kernel_of<kBwd, U, Wt, 16>();
    default: return vec_kernel_of<kBwd, U, Wt, 32>();  // 256 (vec_form)
  }
}
template <bool kBwd, typename U, typename Wt>
void* by_form(int D, bool vec) {
  return vec ? by_head_lanes<kBwd, U, Wt>(D) : by_lanes<kBwd, U, Wt>(D);
}
template <bool kBwd, typename U>
void* by_weight(DType wt, int D, bool vec) {
  return wt == DType::f32 ? by_form<kBwd, U, float>(D, vec) : by_form<kBwd, U, U>(D, vec);
}
template <bool kBwd>
void* pick(DType u, DType wt, int D, bool vec) {
  switch (u) {
    case DType::bf16: return by_weight<kBwd, __nv_bfloat16>(wt, D, vec);
    case DType::f16: return by_weight<kBwd, __half>(wt, D, vec);
    default: return by_form<kBwd, float, float>(D, vec);
  }
}

// A row of 8 channels at (i0, i1, i2) of a view whose last stride is 1 starts 16-byte aligned for every index.
bool rows_of_8(const void* data, int64_t s0, int64_t s1, int64_t s2, int64_t last, int elem) {
  return last == 1 && (reinterpret_cast<uintptr_t>(data) % 16) == 0 && (s0 * elem) % 16 == 0 &&
         (s1 * elem) % 16 == 0 && (s2 * elem) % 16 == 0;
}

// Whether a call takes the vector form (kernels/short_conv_vec.cuh), the default since it ran on an H100 (twenty-fifth
// session, docs/perf/results.md: about 2x the row kernels' rate forward and backward, tests and both sanitizers
// clean); PATHATTN_SHORT_CONV=rows takes the row kernels for every call (the A/B). What the form needs: D in {8, 16,
// 32, 64, 128, 256}, K <= kVecMaxK, no state (nor dstate), and rows of 8 contiguous, 16-byte aligned channels in u
// and w (forward), u, dw and du (backward). Any other call takes the row kernels.
bool vec_form(const ShortConvParams& p, DType u_dt, bool backward) {
  static const bool on = env::choice("PATHATTN_SHORT_CONV", {"rows", "vec"}, "vec") == "vec";
  const bool d_ok = p.D == 8 || p.D == 16 || p.D == 32 || p.D == 64 || p.D == 128 || p.D == 256;
  if (!on || !d_ok || p.K > kVecMaxK || p.state != nullptr || p.dstate != nullptr) return false;
  const int ue = u_dt == DType::f32 ? 4 : 2;
  // the channel stride is 1, so the channel offset c0 (a multiple of 8) keeps the alignment
  if (!rows_of_8(p.u, p.u_b, p.u_t, 0, p.u_c, ue)) return false;
  if (!backward) return rows_of_8(p.w, p.w_b, p.w_t, p.w_h, p.w_d, 4);
  return rows_of_8(p.dw, p.dw_b, p.dw_t, p.dw_h, p.dw_d, 4) && rows_of_8(p.du, p.du_b, p.du_t, 0, p.du_c, ue);
}

// The vector form's grid: 32 channel groups x kVecCtaRows rows per CTA, a batch row per z.
dim3 vec_grid(const ShortConvParams& p) {
  return dim3((p.C / kVecCh + kVecGroups - 1) / kVecGroups, std::max(1, (p.T + kVecCtaRows - 1) / kVecCtaRows), p.B);
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
  const bool vec = vec_form(p, in.u.dtype, false);
  const dim3 grid = vec ? vec_grid(p) : dim3((p.T + kConvRowsFwd - 1) / kConvRowsFwd, p.H, p.B);
  launch(pick<false>(in.u.dtype, in.weight.dtype, p.D, vec), grid, 0, p, stream,
         vec ? "short_conv_w_fwd_vec_kernel" : "short_conv_w_fwd_kernel");
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

  // The weight partials: one per (batch row, 64-row tile) for the row kernels, per (batch row, 128-row CTA) for
  // the vector form.
  const bool vec = vec_form(p, in.u.dtype, true);
  if (vec) p.tiles = static_cast<int>(vec_grid(p).y);
  Workspace ws;
  const int partial = ws.add("short_conv_partial", static_cast<std::size_t>(p.B) * p.tiles * p.C * p.K * sizeof(float));
  Inputs alloc;  // only its cuda_workspace is read
  alloc.cuda_workspace = in.cuda_workspace;
  ws.acquire(alloc, in.u.device_index, stream);
  p.partial = ws.ptr<float>(partial);
  // T = 0 still runs one tile per batch row: it writes dstate's zeros and zero partials.
  if (p.B > 0 && vec)
    launch(pick<true>(in.u.dtype, in.weight.dtype, p.D, true), vec_grid(p), 0, p, stream, "short_conv_w_bwd_vec_kernel");
  else if (p.B > 0)
    launch(pick<true>(in.u.dtype, in.weight.dtype, p.D, false), dim3(p.tiles, p.H, p.B), conv_bwd_smem_bytes(p.D, p.K),
           p, stream, "short_conv_w_bwd_kernel");
  const int n = p.C * p.K;
  launch(reinterpret_cast<void*>(&short_conv_w_dweight_kernel), dim3((n + kConvThreads - 1) / kConvThreads), 0, p, stream,
         "short_conv_w_dweight_kernel");
}

}  // namespace pathattn::cuda
