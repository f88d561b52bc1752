// The fused short convolution of w (docs/math.md Eq. 44-46) in its vector form: the same math as short_conv.cuh's
// row kernels, laid out for the memory system. Those give each lane one or two channels of one row (2-byte loads
// of u, K loads per channel and row) and reach ~10% of the copy bandwidth (docs/perf/results.md, twenty-fourth
// session); here a thread owns 8 consecutive channels (one 16-byte load of 16-bit u, two float4 of w) and a run of
// kVecRows consecutive rows, with the inputs of the last K positions and the taps in registers, so that a row costs
// one vector load of u and one vector store of w. A head's norm is a reduction over its D / 8 lanes.
//   CTA: 8 warps; warp = one run of rows, lane = one 8-channel group (32 groups: 256 channels = 4 heads at D 64).
//   backward: each thread walks its run from the top down (plus the K - 1 rows above it, whose dy its last du rows
//   need), keeping the inputs t .. t - K + 1 and the dy of rows t .. t + K - 1 in registers; du of row t, then the
//   weight partials of row t's taps; the CTA adds its 8 runs' partials in warp order, and short_conv_w_dweight_kernel
//   adds the CTAs' in order (the same bits on every run).
// Where it applies (launch/short_conv.cu vec_form): D in {8, 16, 32, 64, 128, 256} (a head's lanes divide a
// warp), K <= kVecMaxK, no state, contiguous and 16-byte aligned channel rows of u, w, dw and du.
#pragma once

#include "cuda/kernels/short_conv.cuh"

namespace pathattn::cuda {

constexpr int kVecCh = 8;                              // channels per thread
constexpr int kVecRows = 16;                           // rows per thread (a run)
constexpr int kVecMaxK = 4;                            // the vector form's kernel sizes (larger: the row kernels)
constexpr int kVecGroups = 32;                         // 8-channel groups per CTA: one per lane
constexpr int kVecRuns = kConvThreads / 32;            // runs per CTA: one per warp
constexpr int kVecCtaRows = kVecRuns * kVecRows;       // rows per CTA (128)

// Eight consecutive elements as floats (16-bit: one 16-byte load; f32: two float4), and back.
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
template <typename T2, typename F>
__device__ __forceinline__ void unpack8(const uint4& v, float (&x)[8], F to_float2) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = to_float2(*reinterpret_cast<const T2*>(&w[i]));
    x[2 * i] = f.x, x[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&x)[8]) {
  unpack8<__nv_bfloat162>(*reinterpret_cast<const uint4*>(p), x, [](__nv_bfloat162 h) { return __bfloat1622float2(h); });
}
__device__ __forceinline__ void load8(const __half* p, float (&x)[8]) {
  unpack8<__half2>(*reinterpret_cast<const uint4*>(p), x, [](__half2 h) { return __half22float2(h); });
}
__device__ __forceinline__ void store8(float* p, const float (&x)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
}
template <typename T2, typename F>
__device__ __forceinline__ uint4 pack8(const float (&x)[8], F from_floats) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const T2 h = from_floats(x[2 * i], x[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&x)[8]) {
  *reinterpret_cast<uint4*>(p) = pack8<__nv_bfloat162>(x, [](float a, float b) { return __floats2bfloat162_rn(a, b); });
}
__device__ __forceinline__ void store8(__half* p, const float (&x)[8]) {
  *reinterpret_cast<uint4*>(p) = pack8<__half2>(x, [](float a, float b) { return __floats2half2_rn(a, b); });
}

// The sum over a head's DL lanes (aligned groups of DL consecutive lanes; every lane of the warp takes part).
template <int DL>
__device__ __forceinline__ float head_sum(float x) {
#pragma unroll
  for (int o = DL / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// A thread's place: its 8 channels c0.. (head h, dims d0..), its run of rows t_begin.., and whether its group
// exists (lanes past the last group compute on zeros and store nothing, but take part in the head sums).
struct VecPlace {
  int b, c0, h, d0, t_begin;
  bool live;
  __device__ __forceinline__ explicit VecPlace(const ShortConvParams& p) {
    const int g = blockIdx.x * kVecGroups + threadIdx.x % 32;
    live = g < p.C / kVecCh;
    c0 = live ? g * kVecCh : 0;
    h = c0 / p.D;
    d0 = c0 % p.D;
    b = blockIdx.z;
    t_begin = (blockIdx.y * kVecRuns + threadIdx.x / 32) * kVecRows;
  }
};

// u's 8 channels at position s (zero outside 0 <= s < T: the vector form has no state), and the taps reversed,
// tap[m][i] = weight[c0 + i, K - 1 - m] (0 for m >= K).
template <typename U>
__device__ __forceinline__ void vec_input(const ShortConvParams& p, const VecPlace& v, int s, float (&x)[8]) {
  if (v.live && s >= 0 && s < p.T)
    load8(static_cast<const U*>(p.u) + v.b * p.u_b + static_cast<int64_t>(s) * p.u_t + v.c0, x);
  else
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = 0.f;
}
template <typename Wt>
__device__ __forceinline__ void vec_taps(const ShortConvParams& p, const VecPlace& v, float (&tap)[kVecMaxK][8]) {
#pragma unroll
  for (int m = 0; m < kVecMaxK; ++m)
#pragma unroll
    for (int i = 0; i < 8; ++i) tap[m][i] = v.live && m < p.K ? conv_weight<Wt>(p, v.c0 + i, p.K - 1 - m) : 0.f;
}

// y, silu(y) of row t from the inputs x[m] = position t - m (only m <= lim: positions in t's sequence), and the
// head's norm max(|a|, eps) (Eq. 44-45); |a| unclamped in *norm.
template <int DL>
__device__ __forceinline__ float vec_row(const ShortConvParams& p, const float (&tap)[kVecMaxK][8],
                                         const float (&x)[kVecMaxK][8], int lim, float (&y)[8], float (&a)[8],
                                         float* norm) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float acc = 0.f;
#pragma unroll
    for (int m = 0; m < kVecMaxK; ++m)
      if (m <= lim) acc = fmaf(tap[m][i], x[m][i], acc);  // (tap is 0 for m >= K)
    y[i] = acc;
    a[i] = acc / (1.f + __expf(-acc));
    ss = fmaf(a[i], a[i], ss);
  }
  *norm = sqrtf(head_sum<DL>(ss));
  return fmaxf(*norm, p.eps);
}

// How far back row t's sequence reaches: position t - m is in it for m <= t - start (no limit without cu_seqlens;
// positions before 0 read zero there).
__device__ __forceinline__ int vec_lim(const ShortConvParams& p, int t) {
  return p.cu != nullptr ? t - conv_seq_start(p, t) : kVecMaxK;
}

template <typename U, typename Wt, int DL>
__global__ void __launch_bounds__(kConvThreads) short_conv_w_fwd_vec_kernel(ShortConvParams p) {
  const VecPlace v(p);
  if (v.t_begin >= p.T) return;  // warp-uniform
  float tap[kVecMaxK][8], x[kVecMaxK][8];
  vec_taps<Wt>(p, v, tap);
  // x[m] holds position t - 1 - m before row t's shift (the first row's K - 1 earlier positions).
#pragma unroll
  for (int m = 0; m < kVecMaxK; ++m) vec_input<U>(p, v, m < p.K - 1 ? v.t_begin - 1 - m : -1, x[m]);
  // The next row's input is loaded one row ahead, so that a warp has it in flight while it computes this row.
  float next[8];
  vec_input<U>(p, v, v.t_begin, next);
  for (int r = 0; r < kVecRows; ++r) {
    const int t = v.t_begin + r;
#pragma unroll
    for (int m = kVecMaxK - 1; m > 0; --m)
#pragma unroll
      for (int i = 0; i < 8; ++i) x[m][i] = x[m - 1][i];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[0][i] = next[i];
    if (r + 1 < kVecRows) vec_input<U>(p, v, t + 1, next);
    float y[8], a[8], norm;
    const float n = vec_row<DL>(p, tap, x, t < p.T ? vec_lim(p, t) : 0, y, a, &norm);
    if (v.live && t < p.T) {
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] /= n;
      store8(p.w + v.b * p.w_b + static_cast<int64_t>(t) * p.w_t + v.h * p.w_h + v.d0, a);
    }
  }
}

// Shared memory of the backward CTA: the runs' weight partials [kVecRuns][32 lanes][kVecMaxK][8].
constexpr int kVecBwdSmemFloats = kVecRuns * 32 * kVecMaxK * 8;

template <typename U, typename Wt, int DL>
__global__ void __launch_bounds__(kConvThreads) short_conv_w_bwd_vec_kernel(ShortConvParams p) {
  __shared__ float red_s[kVecBwdSmemFloats];
  const VecPlace v(p);
  const int K = p.K, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int t_end = min(v.t_begin + kVecRows, p.T);  // this run's rows [t_begin, t_end) (empty past T)
  float tap[kVecMaxK][8], acc[kVecMaxK][8];
  vec_taps<Wt>(p, v, tap);
#pragma unroll
  for (int m = 0; m < kVecMaxK; ++m)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[m][i] = 0.f;
  if (v.t_begin < p.T) {  // warp-uniform
    // From the top row whose dy this run needs (du of row s reads dy of rows s .. s + K - 1) down to t_begin.
    const int t_top = min(t_end - 1 + K - 1, p.T - 1);
    float x[kVecMaxK][8], dyw[kVecMaxK][8];  // x[m]: position t - m; dyw[m]: dy of row t + m (0 past T)
    int startw[kVecMaxK];                     // the sequence start of row t + m
#pragma unroll
    for (int m = 0; m < kVecMaxK; ++m) {
      vec_input<U>(p, v, m < K ? t_top - m : -1, x[m]);
      startw[m] = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) dyw[m][i] = 0.f;
    }
    // dw's row and the next input position, loaded one row ahead (in flight while the row computes).
    auto load_dw = [&](int t, float (&g)[8]) {
      if (v.live)
        load8(p.dw + v.b * p.dw_b + static_cast<int64_t>(t) * p.dw_t + v.h * p.dw_h + v.d0, g);
      else
#pragma unroll
        for (int i = 0; i < 8; ++i) g[i] = 0.f;
    };
    float g_next[8], nx[8];
    load_dw(t_top, g_next);
    vec_input<U>(p, v, t_top - K, nx);
    for (int t = t_top; t >= v.t_begin; --t) {
      // dy of row t (Eq. 46): the forward's y and a recomputed, dw's row, the norm's backward.
      float g[8], nx_t[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) g[i] = g_next[i], nx_t[i] = nx[i];
      if (t > v.t_begin) {
        load_dw(t - 1, g_next);
        vec_input<U>(p, v, t - 1 - K, nx);
      }
      const int lim = vec_lim(p, t);
      float y[8], a[8], norm, dy[8];
      const float n = vec_row<DL>(p, tap, x, lim, y, a, &norm);
      float wdw = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) wdw = fmaf(a[i] / n, g[i], wdw);
      wdw = head_sum<DL>(wdw);
      const bool clamped = !(norm >= p.eps);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float da = clamped ? g[i] / p.eps : (g[i] - a[i] / n * wdw) / n;
        const float sg = 1.f / (1.f + __expf(-y[i]));
        dy[i] = da * sg * (1.f + y[i] * (1.f - sg));
      }
#pragma unroll
      for (int m = kVecMaxK - 1; m > 0; --m) {
        startw[m] = startw[m - 1];
#pragma unroll
        for (int i = 0; i < 8; ++i) dyw[m][i] = dyw[m - 1][i];
      }
      startw[0] = t - lim;  // (t - kVecMaxK without cu_seqlens: every later row's sequence holds t)
#pragma unroll
      for (int i = 0; i < 8; ++i) dyw[0][i] = dy[i];
      if (t < t_end) {
        // du of position t: sum over the rows t + m that read it with tap K - 1 - m (Eq. 46), those in t's
        // sequence; rows past T have dy = 0.
        float du[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) du[i] = 0.f;
#pragma unroll
        for (int m = 0; m < kVecMaxK; ++m)
          if (m < K && startw[m] <= t)
#pragma unroll
            for (int i = 0; i < 8; ++i) du[i] = fmaf(tap[m][i], dyw[m][i], du[i]);
        if (v.live) store8(static_cast<U*>(p.du) + v.b * p.du_b + static_cast<int64_t>(t) * p.du_t + v.c0, du);
        // dweight[c, K - 1 - m] += dy[t, c] x(t - m): row t's own taps, positions in its sequence.
#pragma unroll
        for (int m = 0; m < kVecMaxK; ++m)
          if (m < K && m <= lim)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[m][i] = fmaf(dy[i], x[m][i], acc[m][i]);
      }
      // Down one row: x[m] <- position t - 1 - m (x[K - 1] the one new position, t - K; zeros above it).
#pragma unroll
      for (int m = 0; m < kVecMaxK; ++m)
#pragma unroll
        for (int i = 0; i < 8; ++i) x[m][i] = m == K - 1 ? nx_t[i] : m + 1 < kVecMaxK ? x[m + 1][i] : 0.f;
    }
  }
  // The runs' partials added in run order, one [channels, K] block per CTA (zeros for runs past T).
#pragma unroll
  for (int m = 0; m < kVecMaxK; ++m)
#pragma unroll
    for (int i = 0; i < 8; ++i) red_s[((warp * 32 + lane) * kVecMaxK + m) * 8 + i] = acc[m][i];
  __syncthreads();
  const int groups = min(kVecGroups, p.C / kVecCh - static_cast<int>(blockIdx.x) * kVecGroups);
  for (int e = threadIdx.x; e < groups * K * 8; e += kConvThreads) {
    const int gl = e / (K * 8), m = (e / 8) % K, i = e % 8;  // (lane, tap m, channel i)
    float sum = 0.f;
    for (int w = 0; w < kVecRuns; ++w) sum += red_s[((w * 32 + gl) * kVecMaxK + m) * 8 + i];
    const int c = (blockIdx.x * kVecGroups + gl) * kVecCh + i;
    p.partial[(static_cast<int64_t>(v.b) * p.tiles + blockIdx.y) * p.C * K + c * K + (K - 1 - m)] = sum;
  }
}

}  // namespace pathattn::cuda
