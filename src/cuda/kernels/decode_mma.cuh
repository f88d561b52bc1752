// The decode's split kernel for a 16-bit cache on tensor cores (docs/math.md Eq. 42; docs/cuda.md "Decode"): bf16
// inputs, bf16 keys, bf16 values, the plain or the checkpointed cache (kCkpt, below). It does what
// decode_split_kernel (kernels/decode.cuh) does, with the same blocks, splits, partials and combine kernel, but
// forms the dot products of a block of cached rows as mma.sync m16n8k16 products instead of one team reduction
// (4 shuffle levels) per row and query head: with a bf16 cache the team kernel reaches 42-50% of the copy
// bandwidth at B = 64 and its step takes 84-88% of the f32 cache's time, bound by that per-row work
// (docs/perf/notes.md, "Decode").
//
// One warp takes 16 cached rows at a time (the 8 warps of a block interleave over the split's rows):
//   S = A C^T (16 x 16 rows)   A = [w_hi; q_0 .. q_6; w_mid; q_7; w_lo; 0 ..] (rows 0, 8 and 10 the three bf16
//                              parts of w_t, Eq. 42; rows of heads past the group zero), C the rows as loaded
//   a_j = beta (S[0, j] + (S[8, j] + S[10, j])), l = scale (S[r, j] - a_j (q_r . w_t)) + G_t - G_j   (Eq. 42)
//   c_j <- c_j - a_j w_t, stored (first pass only); online softmax per head row; O += P V (P in bf16, as
//   FlashAttention rounds it; l sums the rounded P, so o is a convex combination of the values).
// Lane layout (lane = 4 gq + tq; fragments: kernels/common.cuh). The order of dimensions inside a dot product is
// free, so logical k of the S product maps to the physical element d = (D / 4) tq + 4 ks + {0, 1, 2, 3}
// (k-step ks; k = 2 tq, 2 tq + 1, 2 tq + 8, 2 tq + 9): each lane loads D / 4 contiguous elements of its row gq of
// each 8-row tile (16-byte loads), and the same chunk of A's rows. For P V the output column n of n-tile jt is
// element d = (D / 8) n + jt, so each lane loads D / 8 contiguous values of its four rows 2 tq, 2 tq + 1,
// 2 tq + 8, 2 tq + 9 and pairs them per column with byte permutes.
// Heads: 8 per pass (rows 1..7 and 9); larger groups take group / 8 passes, the later ones reading back (same
// lanes, same chunks) the rows the first carried. Rows need 16-byte aligned cache rows (decode_mma_fits).
// kCkpt (the checkpointed cache, docs/math.md Eq. 35): rows below the checkpoint are read with the carried-back
// query q~ (f32, the carry kernel's) and neither carried nor written. Their logits come from a second product,
// A~ = [0; q~_hi of heads 0..6; 0; q~_lo of heads 0..6], so that each head's two halves sit in one lane (rows gq
// and gq + 8) and sum there; hence 7 heads per pass. A~ is the same for every warp: it is kept in shared memory,
// not in registers. A block of 16 rows runs the product(s) its rows need (old, recent or both).
#pragma once

#include "cuda/kernels/decode.cuh"

namespace pathattn::cuda {

constexpr int kDecodeMmaHeads = 8;  // query heads per pass

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int D, bool kCkpt = false>
__global__ void __launch_bounds__(kDecodeThreads, D == 64 ? 2 : 1) decode_split_mma_kernel(const DecodeParams p) {
  using T = __nv_bfloat16;
  constexpr int kWarps = kDecodeThreads / 32;
  constexpr int kRows = 16;     // cached rows per warp per iteration: two n-tiles of 8
  constexpr int kKS = D / 16;   // k-steps of S
  constexpr int kKC = D / 4;    // key elements per lane per row
  constexpr int kKW = kKC / 2;  // ... as bf16 pairs
  constexpr int kKV = kKC / 8;  // ... as 16-byte vectors
  constexpr int kNT = D / 8;    // n-tiles of P V = value elements per lane per row
  constexpr int kVV = kNT / 8;  // ... as 16-byte vectors
  constexpr int kH = kCkpt ? kDecodeMmaHeads - 1 : kDecodeMmaHeads;  // heads per pass
  constexpr float kLog2e = 1.4426950408889634f;
  static_assert(kKV >= 1 && kVV >= 1, "D = 64 or 128");
  __shared__ float sm_ml[kWarps][kH][2];
  __shared__ __align__(16) float sm_o[kWarps][kH][D];
  __shared__ __align__(16) float sm_w[D];  // w_t in f32, for the carry
  __shared__ __align__(16) uint32_t sm_aold[kCkpt ? kKS : 1][32][4];  // A~'s fragments per k-step and lane

  pdl_launch_dependents();  // the combine kernel may be scheduled now: it waits (pdl_wait) for this grid
  const SplitBlock sb = decode_split_block<kCkpt>(p);
  if (!sb.ok) return;  // the combine kernel writes NaN
  const int b = sb.b, h = sb.h, split = sb.split, L0 = sb.L0, ckpt = sb.ckpt, r0 = sb.r0, r1 = sb.r1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
  const int t = p.step;
  const bool first = split == 0;
  const bool gate = p.g != nullptr;

  const int64_t woff = b * p.sw.b + t * p.sw.t + h * p.sw.h;
  for (int d = threadIdx.x; d < D; d += kDecodeThreads) sm_w[d] = load_w(p.w, woff + d, p.w_is_bf16);
  const float beta = p.beta[b * p.sbeta.b + t * p.sbeta.t + h * p.sbeta.h];
  T* const ck = static_cast<T*>(p.ck);
  T* const cv = static_cast<T*>(p.cv);
  const int64_t ck0 = b * p.sck.b + h * p.sck.h, cv0 = b * p.scv.b + h * p.scv.h;
  const T* const knew = static_cast<const T*>(p.k) + b * p.sk.b + t * p.sk.t + h * p.sk.h;
  const T* const vnew = static_cast<const T*>(p.v) + b * p.sv.b + t * p.sv.t + h * p.sv.h;
  // The new key and value at row L0 (split 0), as given: the cache's type is the inputs'.
  if (first && threadIdx.x < D / 2) {
    const int i = 2 * threadIdx.x;
    *reinterpret_cast<uint32_t*>(ck + ck0 + L0 * p.sck.t + i) = *reinterpret_cast<const uint32_t*>(knew + i);
    *reinterpret_cast<uint32_t*>(cv + cv0 + L0 * p.scv.t + i) = *reinterpret_cast<const uint32_t*>(vnew + i);
  }
  __syncthreads();  // sm_w

  const int d0 = kKC * tq;  // this lane's chunk of every key row and of A's rows
  for (int hp = 0; hp < p.group; hp += kH) {
    const bool carry = hp == 0;  // the first pass carries each row over H_t and writes it back
    // This lane's rows of A: gq and gq + 8; rows 0, 8 and 10 are w_hi, w_mid and w_lo, row r of 1..7 is head
    // r - 1, row 9 head 7 (zero past the group; kCkpt passes have 7 heads, so row 9 is zero there).
    const int hl = gq - 1, hh = gq + 6;
    const bool vl = gq >= 1 && hp + hl < p.group;
    const bool vh = gq >= 1 && hh < kH && hp + hh < p.group;
    const T* const ql = static_cast<const T*>(p.q) + b * p.sq.b + t * p.sq.t + (h * p.group + hp + hl) * p.sq.h;
    const T* const qh = static_cast<const T*>(p.q) + b * p.sq.b + t * p.sq.t + (h * p.group + hp + hh) * p.sq.h;
    uint32_t alo[kKW], ahi[kKW];
    float qwl = 0.f, qwh = 0.f, selfl = 0.f, selfh = 0.f;  // q . w_t and q . k_t, this lane's share
#pragma unroll
    for (int i = 0; i < kKW; ++i) {
      const int d = d0 + 2 * i;
      const float w0 = sm_w[d], w1 = sm_w[d + 1];
      // w = w_hi + w_mid + w_lo (bf16_split3): a_j as accurate as an f32 dot product, since the key is bf16 and
      // every product is exact. Two parts (16 bits) left a_j's error at ~2^-17, which over tens to hundreds of
      // carries put a bf16 cache 4-9x farther from the CPU decode's than the team kernel does (no farther from f64;
      // twelfth session, docs/perf/notes.md).
      const Bf16Parts w0p = bf16_split3(w0), w1p = bf16_split3(w1);
      if (gq == 0) {
        alo[i] = TypeTraits<T>::pack(w0p.hi, w1p.hi);  // exact
        ahi[i] = TypeTraits<T>::pack(w0p.mid, w1p.mid);  // exact
      } else {
        alo[i] = vl ? *reinterpret_cast<const uint32_t*>(ql + d) : 0u;
        if (vh)
          ahi[i] = *reinterpret_cast<const uint32_t*>(qh + d);
        else  // row 10: w_lo; rows 9 (kCkpt) and 11..15: zero
          ahi[i] = gq == 2 ? TypeTraits<T>::pack(w0p.lo, w1p.lo) : 0u;
        const float2 fl = TypeTraits<T>::unpack(alo[i]), fh = TypeTraits<T>::unpack(ahi[i]);
        qwl += fl.x * w0 + fl.y * w1;
        qwh += fh.x * w0 + fh.y * w1;
        if (first) {
          const float2 kn = TypeTraits<T>::unpack(*reinterpret_cast<const uint32_t*>(knew + d));
          selfl += fl.x * kn.x + fl.y * kn.y;
          selfh += fh.x * kn.x + fh.y * kn.y;
        }
      }
    }
    qwl = quad_sum(qwl);
    qwh = quad_sum(qwh);
    selfl = quad_sum(selfl);
    selfh = quad_sum(selfh);

    if constexpr (kCkpt) {
      // A~ (warp 0 writes it; the barrier before the loop publishes it, the one ending the pass protects it).
      if (warp == 0) {
        const float* qc = p.qcarried + (static_cast<int64_t>(b) * p.HQ + h * p.group + hp + hl) * D + d0;
#pragma unroll
        for (int ks = 0; ks < kKS; ++ks) {
          const float4 x = vl ? *reinterpret_cast<const float4*>(qc + 4 * ks) : make_float4(0.f, 0.f, 0.f, 0.f);
          const __nv_bfloat16 h0 = __float2bfloat16_rn(x.x), h1 = __float2bfloat16_rn(x.y),
                              h2 = __float2bfloat16_rn(x.z), h3 = __float2bfloat16_rn(x.w);
          const float f0 = __bfloat162float(h0), f1 = __bfloat162float(h1), f2 = __bfloat162float(h2),
                      f3 = __bfloat162float(h3);
          // rows gq (hi) and gq + 8 (lo); logical k 2 tq, 2 tq + 1 <- elements 4 ks, 4 ks + 1; k + 8 <- + 2, + 3
          *reinterpret_cast<uint4*>(sm_aold[ks][lane]) =
              make_uint4(TypeTraits<T>::pack(f0, f1), TypeTraits<T>::pack(x.x - f0, x.y - f1),
                         TypeTraits<T>::pack(f2, f3), TypeTraits<T>::pack(x.z - f2, x.w - f3));
        }
      }
      __syncthreads();
    }

    // G_t per head row (f64, docs/spec.md §6), continuing from the last cached token; split 0 appends it.
    const int64_t gol = b * p.scg.b + (h * p.group + hp + hl) * p.scg.h;
    const int64_t goh = b * p.scg.b + (h * p.group + hp + hh) * p.scg.h;
    double gtl = 0.0, gth = 0.0;
    if (gate) {
      if (vl) gtl = (L0 > 0 ? load_gcum(p, gol + (L0 - 1) * p.scg.t) : 0.0) +
                    static_cast<double>(p.g[b * p.sg.b + t * p.sg.t + (h * p.group + hp + hl) * p.sg.h]);
      if (vh) gth = (L0 > 0 ? load_gcum(p, goh + (L0 - 1) * p.scg.t) : 0.0) +
                    static_cast<double>(p.g[b * p.sg.b + t * p.sg.t + (h * p.group + hp + hh) * p.sg.h]);
      if (first && warp == 0 && tq == 0) {
        if (vl) store_gcum(p, gol + L0 * p.scg.t, gtl);
        if (vh) store_gcum(p, goh + L0 * p.scg.t, gth);
      }
    }

    // Running softmax state per head row; warp 0 of split 0 starts with the new token's own logit (scale q_t . k_t,
    // gate term 0: its key is not carried by its own H_t) and its value.
    const bool own = first && warp == 0;
    float ml = own && vl ? p.scale_log2 * selfl : -INFINITY, mh = own && vh ? p.scale_log2 * selfh : -INFINITY;
    // l is kept per lane (its columns' share) and summed over the quad at the end: the new token counts once.
    float ll = own && vl && tq == 0 ? 1.f : 0.f, lh = own && vh && tq == 0 ? 1.f : 0.f;
    float o[kNT][4];
#pragma unroll
    for (int jt = 0; jt < kNT; ++jt) {
      const float v0 = own ? __bfloat162float(vnew[kNT * (2 * tq) + jt]) : 0.f;
      const float v1 = own ? __bfloat162float(vnew[kNT * (2 * tq + 1) + jt]) : 0.f;
      o[jt][0] = vl ? v0 : 0.f;
      o[jt][1] = vl ? v1 : 0.f;
      o[jt][2] = vh ? v0 : 0.f;
      o[jt][3] = vh ? v1 : 0.f;
    }

    // The loop bound is uniform over the warp (mma and shuffles need every lane); rows past r1 load as zeros and
    // are masked.
    for (int base = r0 + kRows * warp; base < r1; base += kRows * kWarps) {
      uint4 kr[2][kKV];  // keys: row base + 8 tau + gq, elements [d0, d0 + kKC)
      int krow[2];
#pragma unroll
      for (int tau = 0; tau < 2; ++tau) {
        krow[tau] = base + 8 * tau + gq;
#pragma unroll
        for (int v = 0; v < kKV; ++v)
          kr[tau][v] = krow[tau] < r1 ? *reinterpret_cast<const uint4*>(ck + ck0 + krow[tau] * p.sck.t + d0 + 8 * v)
                                      : make_uint4(0u, 0u, 0u, 0u);
      }
      uint4 vr[4][kVV];  // values: rows base + 2 tq + {0, 1, 8, 9}, elements [kNT gq, kNT gq + kNT)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int vrow = base + 2 * tq + (i & 1) + 8 * (i >> 1);
#pragma unroll
        for (int v = 0; v < kVV; ++v)
          vr[i][v] = vrow < r1 ? *reinterpret_cast<const uint4*>(cv + cv0 + vrow * p.scv.t + kNT * gq + 8 * v)
                               : make_uint4(0u, 0u, 0u, 0u);
      }

      // Which rows the block holds (uniform over the warp): old ones (below the checkpoint), recent ones.
      const bool blk_old = kCkpt && base < ckpt, blk_new = !kCkpt || base + kRows > ckpt;
      // S = A C^T for the two 8-row tiles; So = A~ C^T for old rows.
      float s[2][4], so[2][4];
#pragma unroll
      for (int tau = 0; tau < 2; ++tau) {
        s[tau][0] = s[tau][1] = s[tau][2] = s[tau][3] = 0.f;
        so[tau][0] = so[tau][1] = so[tau][2] = so[tau][3] = 0.f;
        if (blk_new) {
#pragma unroll
          for (int ks = 0; ks < kKS; ++ks) {
            const uint32_t a[4] = {alo[2 * ks], ahi[2 * ks], alo[2 * ks + 1], ahi[2 * ks + 1]};
            mma16816<T>(s[tau], a, u4_word(kr[tau][(2 * ks) / 4], (2 * ks) % 4),
                        u4_word(kr[tau][(2 * ks + 1) / 4], (2 * ks + 1) % 4));
          }
        }
        if constexpr (kCkpt) {
          if (blk_old) {
#pragma unroll
            for (int ks = 0; ks < kKS; ++ks) {
              const uint4 f = *reinterpret_cast<const uint4*>(sm_aold[ks][lane]);
              const uint32_t a[4] = {f.x, f.y, f.z, f.w};
              mma16816<T>(so[tau], a, u4_word(kr[tau][(2 * ks) / 4], (2 * ks) % 4),
                          u4_word(kr[tau][(2 * ks + 1) / 4], (2 * ks + 1) % 4));
            }
          }
        }
      }

      // a_j = beta w_t . c_j (rows 0 and 8 of S: lanes 0..3, row 10: lanes 8..11; columns 2 tq, 2 tq + 1), for the
      // key row this lane carries (column gq) and for its two logit columns (2 tq, 2 tq + 1). Only lanes 0..3's
      // sums are read. Later passes read carried rows: a = 0.
      float ac[2] = {0.f, 0.f}, al[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
      if (carry && blk_new) {
#pragma unroll
        for (int tau = 0; tau < 2; ++tau) {
          const float lo0 = __shfl_sync(0xffffffffu, s[tau][2], 8 + tq);
          const float lo1 = __shfl_sync(0xffffffffu, s[tau][3], 8 + tq);
          const float x0 = s[tau][0] + (s[tau][2] + lo0), x1 = s[tau][1] + (s[tau][3] + lo1);
          const float y0 = __shfl_sync(0xffffffffu, x0, gq >> 1), y1 = __shfl_sync(0xffffffffu, x1, gq >> 1);
          ac[tau] = beta * ((gq & 1) ? y1 : y0);
          al[tau][0] = beta * __shfl_sync(0xffffffffu, x0, tq);
          al[tau][1] = beta * __shfl_sync(0xffffffffu, x1, tq);
        }
        // The carry (Eq. 3): c_j - a_j w_t in f32, rounded to the cache's bf16 and stored.
#pragma unroll
        for (int tau = 0; tau < 2; ++tau) {
          if (krow[tau] >= r1 || krow[tau] < ckpt) continue;  // an old row stays at the checkpoint
#pragma unroll
          for (int v = 0; v < kKV; ++v) {
            uint32_t out[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float2 w2 = *reinterpret_cast<const float2*>(&sm_w[d0 + 8 * v + 2 * i]);
              const float2 c = TypeTraits<T>::unpack(u4_word(kr[tau][v], i));
              out[i] = TypeTraits<T>::pack(fmaf(-ac[tau], w2.x, c.x), fmaf(-ac[tau], w2.y, c.y));
            }
            *reinterpret_cast<uint4*>(ck + ck0 + krow[tau] * p.sck.t + d0 + 8 * v) =
                make_uint4(out[0], out[1], out[2], out[3]);
          }
        }
      }

      // Logits (base 2) of this lane's head rows gq (s[.][0..1]) and gq + 8 (s[.][2..3]), masked past r1.
      float xl[2][2], xh[2][2], mtl = -INFINITY, mth = -INFINITY;
#pragma unroll
      for (int tau = 0; tau < 2; ++tau)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int j = base + 8 * tau + 2 * tq + c;
          const bool ok = j < r1;
          // Old rows (kCkpt): q~ . c_j, its two halves in rows gq and gq + 8 (Eq. 35).
          float x = (kCkpt && j < ckpt ? so[tau][c] + so[tau][2 + c] : s[tau][c] - al[tau][c] * qwl) * p.scale_log2;
          float y = (s[tau][2 + c] - al[tau][c] * qwh) * p.scale_log2;
          if (gate && ok) {
            if (vl) x += static_cast<float>(gtl - load_gcum(p, gol + static_cast<int64_t>(j) * p.scg.t)) * kLog2e;
            if (vh) y += static_cast<float>(gth - load_gcum(p, goh + static_cast<int64_t>(j) * p.scg.t)) * kLog2e;
          }
          xl[tau][c] = ok && vl ? x : -INFINITY;
          xh[tau][c] = ok && vh ? y : -INFINITY;
          mtl = fmaxf(mtl, xl[tau][c]);
          mth = fmaxf(mth, xh[tau][c]);
        }
      const float mnl = fmaxf(ml, quad_max(mtl)), mnh = fmaxf(mh, quad_max(mth));  // uniform over the quad
      const float corl = mnl == -INFINITY ? 1.f : exp2f(ml - mnl);
      const float corh = mnh == -INFINITY ? 1.f : exp2f(mh - mnh);
      ml = mnl;
      mh = mnh;
      // P in bf16 as the A operand of P V: the two tiles' C fragments are its 16 x 16 block.
      uint32_t pa[4];
      float suml = 0.f, sumh = 0.f;
#pragma unroll
      for (int tau = 0; tau < 2; ++tau) {
        const float pl0 = mnl == -INFINITY ? 0.f : exp2f(xl[tau][0] - mnl);
        const float pl1 = mnl == -INFINITY ? 0.f : exp2f(xl[tau][1] - mnl);
        const float ph0 = mnh == -INFINITY ? 0.f : exp2f(xh[tau][0] - mnh);
        const float ph1 = mnh == -INFINITY ? 0.f : exp2f(xh[tau][1] - mnh);
        pa[2 * tau] = TypeTraits<T>::pack(pl0, pl1);
        pa[2 * tau + 1] = TypeTraits<T>::pack(ph0, ph1);
        const float2 rl = TypeTraits<T>::unpack(pa[2 * tau]), rh = TypeTraits<T>::unpack(pa[2 * tau + 1]);
        suml += rl.x + rl.y;
        sumh += rh.x + rh.y;
      }
      ll = ll * corl + suml;  // this lane's share; summed over the quad at the end
      lh = lh * corh + sumh;
#pragma unroll
      for (int jt = 0; jt < kNT; ++jt) {
        o[jt][0] *= corl;
        o[jt][1] *= corl;
        o[jt][2] *= corh;
        o[jt][3] *= corh;
        // B of P V for n-tile jt: element jt of this lane's value chunk, rows (2 tq, 2 tq + 1) and (2 tq + 8, + 9).
        const int wi = jt / 2;
        const unsigned sel = (jt & 1) ? 0x7632u : 0x5410u;
        const uint32_t b0 = __byte_perm(u4_word(vr[0][wi / 4], wi % 4), u4_word(vr[1][wi / 4], wi % 4), sel);
        const uint32_t b1 = __byte_perm(u4_word(vr[2][wi / 4], wi % 4), u4_word(vr[3][wi / 4], wi % 4), sel);
        mma16816<T>(o[jt], pa, b0, b1);
      }
    }

    // Merge the warps: one partial per (query head, split).
    ll = quad_sum(ll);
    lh = quad_sum(lh);
    // Head row hd's state; its o is in o[.][c], o[.][c + 1] (c = 0: row gq, c = 2: row gq + 8).
    auto save = [&](int hd, float m, float l, int c) {
      if (tq == 0) {
        sm_ml[warp][hd][0] = m;
        sm_ml[warp][hd][1] = l;
      }
#pragma unroll
      for (int jt = 0; jt < kNT; ++jt) {
        sm_o[warp][hd][kNT * (2 * tq) + jt] = o[jt][c];
        sm_o[warp][hd][kNT * (2 * tq + 1) + jt] = o[jt][c + 1];
      }
    };
    if (vl) save(hl, ml, ll, 0);
    if (vh) save(hh, mh, lh, 2);
    __syncthreads();
    write_split_partials<kWarps, kH, D>(p, sm_ml, sm_o, b, h, hp, split);
    __syncthreads();  // the next pass reuses the shared arrays
  }
}

}  // namespace pathattn::cuda
