// The chunk-local backward (docs/math.md Eq. 24-30, 34), per (chunk, kv head), after the main kernel: the
// diagonal block's attention (Eq. 12 and its softmax backward), the backward of the query- and key-side chunk
// quantities (Q^, S, K^, U, M and the UT solve T), the chunk product's gradient dP_j from the main kernel turned
// into dW, dU (Eq. 34), and the final writes of dq, dk, dv, dw, dbeta (and dG's diagonal part).
//
// Everything is f32 (docs/spec.md §6: beta, w, the solve and the factors stay f32), the products on the tensor cores
// (mm below) in plain TF32 for bf16 inputs and 3xTF32 (~f32) for f16 (kOneTf32; why, launch/bwd_impl.cuh
// local_tf32), but for the two whose operands are both 16-bit inputs (Q K^T, dO V^T: mm16_nosync, exact products
// either way), C x C matrices in shared memory. The C x D operands (W, b W, U, K, V and per query head Q, dO,
// dQ^; K, V, Q, dO kept in the inputs' 16-bit type, which is exact) are in shared memory too at D = 64 (LocalTiles:
// one CTA of 512 threads per SM, 218 KB), in the CTA's scratch slot in global memory at D = 128 (two CTAs of 256);
// the accumulators dU, d(bW), dW, dKcorr stay in the scratch slot, dK^, dV, dP in the workspace, which this kernel
// finishes in place (dqacc -> dq, dkacc -> dk, dvacc -> dv). Why the operands moved (v6): with every operand in
// the global scratch, 40% of the stalls were on L1TEX and each 64 x 64 x 64 product took ~8 us, ~10x its tensor
// time (docs/perf/notes.md, backward v4-v5). Persistent CTAs stride over the (chunk, kv head) tasks; each CTA owns
// one scratch slot, so the scratch is linear in the number of resident CTAs, not in T.
//
// It is O(T C D) work against the main kernel's O(T^2 D); docs/perf/notes.md has its measured share.
#pragma once

#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/tf32.cuh"
#include "cuda/kernels/ut_solve.cuh"
#include "cuda/params.h"

namespace pathattn::cuda {

namespace local_detail {
constexpr int C = kChunk;
// C x C f32 tiles in shared memory, rows of 72 floats: 8-byte aligned rows for float2 fragment loads along k (a
// half-warp's 4 rows x 32 bytes land on 32 distinct banks), and column walks of 8 rows x 4 k's conflict-free too.
constexpr int LC = C + 8;
// Where the C x D operand tiles live (see the top of the file), and the CTA's size: at D = 64 shared memory, rows
// of D + 8 elements (8 floats or 8 16-bit values of padding: a half-warp's float2 / pair loads along k land on
// distinct banks, as LC), and 16 warps, so that with one CTA per SM each scheduler still has four warps (v6, with
// 8 warps, was slower than two CTAs of 8 with global operands: docs/perf/notes.md); at D = 128 the global scratch
// slot, rows of D, 8 warps, two CTAs per SM.
template <int D>
struct LocalTiles {
  static constexpr bool kInSmem = D == 64;
  static constexpr int LD = kInSmem ? D + 8 : D;
  static constexpr int kThreads = kInSmem ? 512 : 256;
  static constexpr int kWarps = kThreads / 32;
  // shared bytes of the operand tiles: W, bW, U, dQ^ in f32, then K, V, Q, dO in 16 bits
  static constexpr int kBytes = kInSmem ? kChunk * LD * (4 * 4 + 4 * 2) : 0;
};

// f32 scratch tiles [C][D] per CTA: staged inputs and chunk-local intermediates; kDKc holds a C x C tile (row
// stride C; D >= C) kept out of shared memory so that two CTAs fit on an SM (docs/perf/notes.md, v3).
enum Tile { kW, kK, kV, kBW, kU, kQ, kDO, kDU, kDBW, kDW, kDKc, kTiles };
static_assert(kTiles == kLocalTiles, "params.h sizes the scratch slots");

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
// Two consecutive elements as floats (a float2 or a 16-bit pair: one 8- or 4-byte load).
__device__ __forceinline__ float2 load_pair(const float* x) { return *reinterpret_cast<const float2*>(x); }
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* x) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x));
}
__device__ __forceinline__ float2 load_pair(const __half* x) { return __half22float2(*reinterpret_cast<const __half2*>(x)); }
template <typename Y>
__device__ __forceinline__ Y from_f(float x) {
  if constexpr (std::is_same_v<Y, float>)
    return x;
  else
    return TypeTraits<Y>::from_float(x);
}


// Which operands of a product hold values exact in TF32 (staged from bf16 / f16 inputs: q, k, v, do), so that
// 3xTF32 needs no low part for them (tf32.cuh, mma_split_a). kTf32 makes the product one plain TF32 product:
// operands rounded to TF32 (round to nearest), no low parts, one mma per tile instead of up to three. The split
// costs most of a 3xTF32 product's instructions (per k-step and warp ~24 of ~34: the products are issue-bound,
// docs/perf/notes.md), and docs/spec.md §6 allows low-precision tensor-core operands with f32 accumulation.
// kRoundC (with kTf32): the product's result is stored rounded to TF32 (round to nearest), for a tile whose every
// later reader is a TF32 product: those readers then take it as exact (kA / kB) and skip their own rounding of each
// fragment element, with the same bits (rounding once where the tile is written, or where every product reads it,
// gives the same operand; the mma ignores the low bits of an already rounded one).
enum Exact { kNone = 0, kA = 1, kB = 2, kTf32 = 4, kRoundC = 8 };
// How each operand is stored: kAK, A(i, k) = A[i lda + k] (else A[k lda + i]); kBK, B(k, j) = B[j ldb + k] (else
// B[k ldb + j]). A product reads an operand whose k is contiguous with float2 loads along k.
enum Layout { kAKBK = 3, kAK = 1, kBK = 2, kANBN = 0 };

// A warp's m16n8 accumulators into Cm (+)= alpha acc, f32, rounded to TF32 where kRound (Exact's kRoundC): the
// lane's elements are rows r and r + 8, columns c, c + 1 of each of NT n tiles of 8 (r = the warp's first row + g,
// c = its first column + 2t). The C fragment is the same for the TF32 (m16n8k8) and 16-bit (m16n8k16) products.
template <bool kRound, int NT>
__device__ __forceinline__ void store_acc(float* Cm, int ldc, int r, int c, const float (&acc)[NT][4], float alpha,
                                          bool accumulate) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float* row = Cm + (r + 8 * half) * ldc + c;
    float2 cin[NT];
    if (accumulate) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) cin[nt] = *reinterpret_cast<const float2*>(row + nt * 8);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float2 v = make_float2(alpha * acc[nt][2 * half], alpha * acc[nt][2 * half + 1]);
      float2 o = accumulate ? make_float2(cin[nt].x + v.x, cin[nt].y + v.y) : v;
      if constexpr (kRound) o = make_float2(tf32(o.x), tf32(o.y));
      *reinterpret_cast<float2*>(row + nt * 8) = o;
    }
  }
}

// Cm[64 x N] (+)= alpha * A B, k < K, A and B as Layout says (generic pointers: shared or global; f32 or 16-bit
// elements, converted to f32 as they are loaded), by the CTA's kWarps warps (8 or 16). On the tensor
// cores in 3xTF32 (~f32 accuracy, docs/spec.md §6): warp w owns rows 16 (w % 4).. and column group w / 4 of
// kWarps / 4 (halves or quarters of N).
// The sum over k is order-free, so inside each 8-wide k-step the fragment slots t and t + 4 take k = 2t and 2t + 1
// whenever an operand has k contiguous: one float2 load fills both (full 32-byte sectors from global memory; v3
// read 16 bytes per row and sector). The operands of KB k-steps are loaded before any of their products, so a
// product waits for one memory latency per KB steps, not one per step (v3). mm ends with a barrier (the next
// product may read Cm); mm_nosync does not: for a product that the next one neither reads nor writes, so that two
// independent products share one barrier. (v5a ran such pairs concurrently on warps 0-3 and 4-7 instead: slower,
// docs/perf/notes.md.)
template <int kWarps, int N, int K, int kExact, int kLayout, typename TA, typename TB>
__device__ __forceinline__ void mm_nosync(float* Cm, int ldc, const TA* A, int lda, const TB* Bm, int ldb,
                                          float alpha, bool accumulate) {
  constexpr int kGroups = kWarps / 4;           // column groups
  static_assert(kWarps % 4 == 0 && N % (8 * kGroups) == 0, "4 row blocks x column groups of whole n tiles");
  constexpr int NT = N / (8 * kGroups);         // n tiles of 8 per warp
  constexpr bool k1x = (kExact & kTf32) != 0;                  // one TF32 product (see Exact)
  // k-steps per load batch (registers: KB (4 + 2 NT) floats). Loading a 64-deep product's operands in one batch of 8
  // and the values added to before the mma (v12's kLean, docs/perf/notes.md) kept the bits but made D = 64 slower.
  constexpr int KB = NT >= 8 ? 2 : 4;
  static_assert(K % (8 * KB) == 0, "K must be a multiple of the load batch");
  constexpr bool kAe = (kExact & kA) != 0, kBe = (kExact & kB) != 0;  // exact in TF32 as stored
  constexpr bool kAx = k1x || kAe, kBx = k1x || kBe;                  // no low part
  constexpr bool kAk = (kLayout & kAK) != 0, kBk = (kLayout & kBK) != 0;
  constexpr bool kRc = k1x && (kExact & kRoundC) != 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = 16 * (warp % 4), c0 = (warp / 4) * (N / kGroups);
  const int klo = (kAk || kBk) ? 2 * t : t, khi = (kAk || kBk) ? 2 * t + 1 : t + 4;  // k of slots t, t + 4
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll 1
  for (int k0 = 0; k0 < K; k0 += 8 * KB) {
    float a[KB][4], b[KB][NT][2];
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      const int k = k0 + 8 * kb;
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // rows g (a0, a2) and g + 8 (a1, a3)
        const int row = r0 + g + 8 * half;
        if constexpr (kAk) {
          const float2 x = load_pair(A + row * lda + k + klo);
          a[kb][half] = x.x;
          a[kb][2 + half] = x.y;
        } else {
          a[kb][half] = to_f(A[(k + klo) * lda + row]);
          a[kb][2 + half] = to_f(A[(k + khi) * lda + row]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = c0 + nt * 8 + g;
        if constexpr (kBk) {
          const float2 y = load_pair(Bm + n * ldb + k + klo);
          b[kb][nt][0] = y.x;
          b[kb][nt][1] = y.y;
        } else {
          b[kb][nt][0] = to_f(Bm[(k + klo) * ldb + n]);
          b[kb][nt][1] = to_f(Bm[(k + khi) * ldb + n]);
        }
      }
    }
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      uint32_t ah[4], al[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ah[i] = kAe ? __float_as_uint(a[kb][i]) : tf32_bits(a[kb][i]);
        al[i] = kAx ? 0u : tf32_bits(a[kb][i] - __uint_as_float(ah[i]));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if constexpr (k1x && !kBe) {  // round to nearest (mma would drop the low bits of an unrounded operand)
          b[kb][nt][0] = tf32(b[kb][nt][0]);
          b[kb][nt][1] = tf32(b[kb][nt][1]);
        }
        mma_split_a<kAx, kBx>(acc[nt], ah, al, b[kb][nt][0], b[kb][nt][1]);
      }
    }
  }
  store_acc<kRc>(Cm, ldc, r0 + g, c0 + 2 * t, acc, alpha, accumulate);
}

template <int kWarps, int N, int K, int kExact, int kLayout, typename TA, typename TB>
__device__ __forceinline__ void mm(float* Cm, int ldc, const TA* A, int lda, const TB* Bm, int ldb, float alpha,
                                   bool accumulate) {
  mm_nosync<kWarps, N, K, kExact, kLayout>(Cm, ldc, A, lda, Bm, ldb, alpha, accumulate);
  __syncthreads();
}

// Cm[64 x N] (+)= alpha A B^T for A [64 x K] and B [N x K] both in the inputs' 16-bit type (bf16 or f16) with k
// contiguous, by the CTA's kWarps warps (the warp tiling of mm_nosync): Q K^T and dO V^T, the two products whose
// operands are both staged inputs. Products of 16-bit values are exact in f32, so one m16n8k16 in the inputs' type
// (common.cuh mma16816) does the work of two TF32 (or 3xTF32 with exact operands) k-steps: half the mma, and each
// fragment register is one 32-bit load of a 16-bit pair, used as loaded (no unpacking to f32, no conversion).
// Bank-conflict-free at D = 64's row stride (LD = 72 elements: 36 words; g's rows 4 words apart). v23
// (docs/perf/notes.md): bwd_local -2 to -3% at D = 64 (32 x 4096: 33.05 -> 32.09 ms, H100); the sums' rounding in
// the tensor core differs from two TF32 k-steps', so 35 of 71 cases' errors moved in their fourth digit (reference
// docs/perf/errors_bwd_3daaef3.txt).
template <int kWarps, int N, int K, typename T>
__device__ __forceinline__ void mm16_nosync(float* Cm, int ldc, const T* A, int lda, const T* Bm, int ldb, float alpha,
                                            bool accumulate) {
  static_assert(sizeof(T) == 2, "16-bit operands");
  constexpr int kGroups = kWarps / 4;
  static_assert(kWarps % 4 == 0 && N % (8 * kGroups) == 0, "4 row blocks x column groups of whole n tiles");
  constexpr int NT = N / (8 * kGroups);
  constexpr int KB = 2;  // k16-steps per load batch: 32 k's, as mm_nosync's batches of 4 (or 2 x NT >= 8) k8-steps
  static_assert(K % (16 * KB) == 0, "K must be a multiple of the load batch");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = 16 * (warp % 4), c0 = (warp / 4) * (N / kGroups);
  auto pair = [](const T* x) { return *reinterpret_cast<const uint32_t*>(x); };
  float acc[NT][4];
  zero_acc(acc);
#pragma unroll 1
  for (int k0 = 0; k0 < K; k0 += 16 * KB) {
    uint32_t a[KB][4], b[KB][NT][2];
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      const int k = k0 + 16 * kb + 2 * t;
      const T* a_lo = A + (r0 + g) * lda + k;  // rows g and g + 8; k and k + 8 (the A fragment of common.cuh)
      a[kb][0] = pair(a_lo);
      a[kb][1] = pair(a_lo + 8 * lda);
      a[kb][2] = pair(a_lo + 8);
      a[kb][3] = pair(a_lo + 8 * lda + 8);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const T* b_col = Bm + (c0 + nt * 8 + g) * ldb + k;
        b[kb][nt][0] = pair(b_col);
        b[kb][nt][1] = pair(b_col + 8);
      }
    }
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma16816<T>(acc[nt], a[kb], b[kb][nt][0], b[kb][nt][1]);
    }
  }
  store_acc<false>(Cm, ldc, r0 + g, c0 + 2 * t, acc, alpha, accumulate);
}

// x rounded to TF32 where kRound (a tile read only by TF32 products from here on: Exact's kRoundC), else x.
template <bool kRound>
__device__ __forceinline__ float round_if(float x) {
  if constexpr (kRound)
    return tf32(x);
  else
    return x;
}

// A thread's share of a [C, D] tile moved between global and shared memory: kPer elements, element e = threadIdx.x
// + i kThreads (row e / D, column e % D), in batches of kBatch whose loads are all issued before their stores (one
// memory latency per batch).
template <int D>
struct Share {
  static constexpr int kThreads = LocalTiles<D>::kThreads;
  static constexpr int kPer = C * D / kThreads, kBatch = kPer < 16 ? kPer : 16;
};
// Batch i0 of rows [0, n) of a [C, D] view (row stride rs, elements of type X) as floats; rows >= n are zero.
template <int D, typename X>
__device__ __forceinline__ void load_view(float (&v)[Share<D>::kBatch], const X* src, int64_t rs, int n, int i0) {
#pragma unroll
  for (int i = 0; i < Share<D>::kBatch; ++i) {
    const int e = threadIdx.x + (i0 + i) * Share<D>::kThreads, r = e / D, d = e % D;
    v[i] = r < n ? to_f(src[r * rs + d]) : 0.f;
  }
}
// The same batch into a tile [C][ldd] of type Y (f32, or the inputs' 16-bit type for 16-bit inputs: exact); an f32
// tile rounded to TF32 where kRound (a staged copy read only by TF32 products: round_if).
template <int D, bool kRound = false, typename Y>
__device__ __forceinline__ void store_tile(Y* dst, int ldd, const float (&v)[Share<D>::kBatch], int i0) {
  static_assert(!kRound || std::is_same_v<Y, float>, "only f32 tiles are rounded to TF32");
#pragma unroll
  for (int i = 0; i < Share<D>::kBatch; ++i) {
    const int e = threadIdx.x + (i0 + i) * Share<D>::kThreads;
    dst[(e / D) * ldd + e % D] = from_f<Y>(round_if<kRound>(v[i]));
  }
}

// One tile's batches, one after another (a step of stage_together below).
template <int D, typename Step>
__device__ __forceinline__ void stage_batches(const Step& step) {
#pragma unroll 1
  for (int i0 = 0; i0 < Share<D>::kPer; i0 += Share<D>::kBatch) {
    float v[Share<D>::kBatch];
    step.load(v, i0);
    step.store(v, i0);
  }
}

// A staging step of several tiles, one after another: each tile's `load(v, i0)` fills a batch from global memory,
// then its `store(v, i0)` writes it. (Issuing every tile's loads before the first store, one memory latency per
// step instead of one per tile, was part of v12's kLean: the same bits, slower at D = 64; docs/perf/notes.md.)
template <int D, typename... Steps>
__device__ __forceinline__ void stage_together(const Steps&... steps) {
  (stage_batches<D>(steps), ...);
}
// One tile of stage_together: rows [0, n) of a [C, D] view into a tile [C][ldd]; rows >= n are zero; rounded to
// TF32 where kRound (store_tile).
template <int D, typename Y, typename X, bool kRound = false>
struct StageStep {
  Y* dst;
  int ldd;
  const X* src;
  int64_t rs;
  int n;
  __device__ __forceinline__ void load(float (&v)[Share<D>::kBatch], int i0) const { load_view<D>(v, src, rs, n, i0); }
  __device__ __forceinline__ void store(const float (&v)[Share<D>::kBatch], int i0) const {
    store_tile<D, kRound>(dst, ldd, v, i0);
  }
};
// One tile of stage_together the other way: rows [0, n) of an f32 tile [C][lds] into a [C, D] view of type X.
template <int D, typename X>
struct WriteStep {
  X* dst;
  int64_t rs;
  const float* src;
  int lds;
  int n;
  __device__ __forceinline__ void load(float (&v)[Share<D>::kBatch], int i0) const {
#pragma unroll
    for (int i = 0; i < Share<D>::kBatch; ++i) {
      const int e = threadIdx.x + (i0 + i) * Share<D>::kThreads;
      v[i] = src[(e / D) * lds + e % D];
    }
  }
  __device__ __forceinline__ void store(const float (&v)[Share<D>::kBatch], int i0) const {
#pragma unroll
    for (int i = 0; i < Share<D>::kBatch; ++i) {
      const int e = threadIdx.x + (i0 + i) * Share<D>::kThreads, r = e / D, d = e % D;
      if (r < n) dst[r * rs + d] = from_f<X>(v[i]);
    }
  }
};
template <int D, bool kRound = false, typename Y, typename X>
__device__ __forceinline__ StageStep<D, Y, X, kRound> stage_step(Y* dst, int ldd, const X* src, int64_t rs, int n) {
  return {dst, ldd, src, rs, n};
}
template <int D, typename X>
__device__ __forceinline__ WriteStep<D, X> write_step(X* dst, int64_t rs, const float* src, int lds, int n) {
  return {dst, rs, src, lds, n};
}

// X[i][j] for a C x C tile: keep where keep(i, j) (rounded to TF32 where kRound), else 0.
template <bool kRound, typename F>
__device__ __forceinline__ void mask2(float* X, float* Y, F keep) {  // both tiles, one barrier; Y not rounded
  for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
    const int i = e / C, j = e % C;
    if (!keep(i, j))
      X[i * LC + j] = Y[i * LC + j] = 0.f;
    else if (kRound)
      X[i * LC + j] = round_if<kRound>(X[i * LC + j]);
  }
  __syncthreads();
}
template <bool kRound, typename F>
__device__ __forceinline__ void mask(float* X, F keep) {
  for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
    const int i = e / C, j = e % C;
    X[i * LC + j] = keep(i, j) ? round_if<kRound>(X[i * LC + j]) : 0.f;
  }
  __syncthreads();
}

// dbeta_i += sum_d X[i][d] Y[i][d] for [C][D] tiles (row strides ldx, ldy): 4 threads per row, the first 4 C
// threads (whole warps; the others return).
template <int D>
__device__ __forceinline__ void add_row_dots(float* dbeta, const float* X, int ldx, const float* Y, int ldy) {
  if (threadIdx.x >= 4 * C) return;
  const int row = threadIdx.x / 4, q = threadIdx.x % 4;
  float acc = 0.f;
#pragma unroll 8
  for (int d = q; d < D; d += 4) acc = fmaf(X[row * ldx + d], Y[row * ldy + d], acc);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  if (q == 0) dbeta[row] += acc;
}

// Backward of X = b strict_lower(M) (Y and A of Eq. 12, 10) given dX in dX (C x C): dbeta_i += sum_{j<i} dX_ij M_ij,
// then dX becomes d loss / d M = b_i dX_ij on the strict lower part, 0 elsewhere (rounded to TF32 where kRound).
// Four threads per row (a thread per row walked rows 72 floats apart: 8-way bank conflicts), summed by shuffles in a
// fixed order.
template <bool kRound>
__device__ __forceinline__ void strict_lower_beta_backward(float* dX, const float* M, const float* beta, float* dbeta) {
  if (threadIdx.x < 4 * C) {  // whole warps
    const int i = threadIdx.x / 4, q = threadIdx.x % 4;
    float acc = 0.f;
#pragma unroll 4
    for (int j = q; j < C; j += 4) {
      const float x = j < i ? dX[i * LC + j] : 0.f;
      acc = fmaf(x, M[i * LC + j], acc);
      dX[i * LC + j] = round_if<kRound>(beta[i] * x);
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    if (q == 0) dbeta[i] += acc;
  }
  __syncthreads();
}

// Row sums of a C x C tile into rows[C] (four threads per row, as above). Ends with a barrier.
__device__ __forceinline__ void row_sums(const float* X, float* rows) {
  if (threadIdx.x < 4 * C) {  // whole warps
    const int i = threadIdx.x / 4, q = threadIdx.x % 4;
    float acc = 0.f;
#pragma unroll 4
    for (int j = q; j < C; j += 4) acc += X[i * LC + j];
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    if (q == 0) rows[i] = acc;
  }
  __syncthreads();
}

// v26: rows [0, n) of a [C, D] view (row stride rs elements, 16-byte aligned rows) into a tile [C][ldd] of the same
// element type by 16-byte cp.async (no registers held, nothing waited for here; rows >= n are zero-filled), issued
// by every thread of the CTA, a fixed number of copies each; the caller commits, and waits (cp_async_wait<0>, then a
// barrier) before reading. The thread index is read through a volatile asm so that the compiler recomputes these
// addresses here rather than hoisting each thread's tile offsets out of the task loop into registers held across
// every product (with threadIdx.x the D = 64 TF32 instance's spills went from ~100 to 284 / 432 bytes); and the
// copies per thread are a compile-time count (a loop from the thread index to the tile's end was unrolled with
// remainders at each of the four call sites: +42 KB of code, and the added instruction-fetch stalls cost more than
// the copies saved, docs/perf/notes.md v26).
__device__ __forceinline__ int tid_opaque() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}
template <int D, typename E>
__device__ __forceinline__ void copy_rows_async(E* dst, int ldd, const E* src, int64_t rs, int n) {
  constexpr int kPerRow = D * (int)sizeof(E) / 16, kEl = 16 / (int)sizeof(E), kThreads = LocalTiles<D>::kThreads;
  static_assert(C * kPerRow % kThreads == 0, "whole copies per thread");
  const int tid = tid_opaque();
#pragma unroll
  for (int i = 0; i < C * kPerRow / kThreads; ++i) {
    const int e = tid + i * kThreads, r = e / kPerRow, c = (e % kPerRow) * kEl;
    cp_async16(dst + r * ldd + c, src + (r < n ? r * rs + c : 0), r < n ? 16 : 0);
  }
}

}  // namespace local_detail

template <int D>
constexpr int bwd_local_smem_bytes() {
  return (6 * local_detail::C * local_detail::LC + 6 * local_detail::C) * 4 + local_detail::LocalTiles<D>::kBytes;
}

// D = 128: two CTAs of 256 threads per SM (112 KB of shared memory each, at most 128 registers per thread): the
// kernel is a chain of ~40 small dependent products with a barrier after each, so the other CTA's products fill
// the waits. D = 64: one CTA of 512 threads per SM (218 KB: the operands in shared memory), 128 registers.
// Launched with LocalTiles<D>::kThreads threads.
// kOneTf32: every product one plain TF32 product (Exact's kTf32) instead of 3xTF32; the element-wise steps stay f32
// and the UT solve ~f32 (ut_solve_tc) either way (launch/bwd_impl.cuh local_tf32 picks the instance).
template <typename T, int D, bool kGate, bool kOneTf32>
__global__ void __launch_bounds__(local_detail::LocalTiles<D>::kThreads, local_detail::LocalTiles<D>::kInSmem ? 1 : 2)
    bwd_local_kernel(const BwdParams p) {
  using namespace local_detail;
  // The products' precision bit, or-ed into every product's Exact flags below.
  constexpr int X = kOneTf32 ? local_detail::kTf32 : 0;
  // In the TF32 instances the tiles read only by products are rounded where they are written (RC on the product
  // that writes them, kR on the element-wise step), and the products that read them take them as exact (RA, RB):
  // the same bits as rounding in every product, without the per-fragment conversions (Exact's kRoundC). Rounded:
  // bW, Y, T, Kcorr, U, QWl, P, dS, dQWl, dM, dT, T^T dT, dN + dN^T. The 3xTF32 instances round nothing.
  // Measured at D = 128 as v12's kLean (which at D = 128 was this alone): bwd_local 41.6 -> 40.8 ms at 32 x 4096
  // (H100), the same bits. At D = 64 kLean (this with earlier loads and 8-k-step batches) was slower; this alone is
  // on at D = 64 too since v22 (docs/perf/notes.md; with kS below: bwd_local 35.8 -> 32.9 ms at 32 x 4096, H100,
  // every case's errors the same digits).
  constexpr bool kR = kOneTf32;
  constexpr int RA = kR ? local_detail::kA : 0, RB = kR ? local_detail::kB : 0, RC = kR ? local_detail::kRoundC : 0;
  // At D = 64 the staged copies of dP, dK^, dKcorr and dU (v15) are read only by products too: rounded where they are
  // staged (kS) and taken as exact by their products (SA, SB), the same bits again. (At D = 128 the products read
  // them in place, from global memory.) W was not rounded as it is staged: v22 (c) did that, its element-wise
  // readers (b W, dbeta's row dots) then reading the input's f32 w from global memory, and was 1-2% slower.
  constexpr bool kS = kR && local_detail::LocalTiles<D>::kInSmem;
  constexpr int SA = kS ? local_detail::kA : 0, SB = kS ? local_detail::kB : 0;
  static_assert(!std::is_same_v<T, float>, "the Exact flags below assume q, k, v, do in bf16 or f16");
  constexpr float kLog2e = 1.4426950408889634f;
  static_assert(C == 64, "ut_solve_tc solves 64 x 64 tiles");
  extern __shared__ float smem[];
  float* sT = smem;              // [C][LC]  A, then T = (I + A)^{-1} in place     (Eq. 10)
  float* sKc = sT + C * LC;      // [C][LC]  Kcorr = T Y (the forward's M)          (Eq. 12, 14)
  float* s0 = sKc + C * LC;      // [C][LC]  QWl = lower(Q W^T) per head, then dT
  float* s1 = s0 + C * LC;       // [C][LC]  Y, then S, P per head, then M = W K^T, W W^T
  float* s2 = s1 + C * LC;       // [C][LC]  dl, then ds per head, then dY, T^T dT
  float* s3 = s2 + C * LC;       // [C][LC]  d QWl per head, then Y again, then dA
  float* sBeta = s3 + C * LC;    // [C]
  float* sDbeta = sBeta + C;     // [C]
  float* sLse2 = sDbeta + C;     // [C]
  float* sDelta = sLse2 + C;     // [C]
  float* sG = sDelta + C;        // [C]  gate cumulated inside the chunk
  float* sRows = sG + C;         // [C]  row sums of dl (gate)

  float* scratch = p.local_scratch + (int64_t)blockIdx.x * kLocalTiles * C * D;
  auto tile = [&](int t) { return scratch + t * C * D; };
  // The operands (LocalTiles): [C][LD] each, in shared memory after sRows at D = 64, else in the scratch slot.
  using Tiles = LocalTiles<D>;
  constexpr int LD = Tiles::LD, kThreads = Tiles::kThreads, NW = Tiles::kWarps;
  float *W, *bW, *U, *sDq;  // sDq: dQ^ of the current query head in shared memory (D = 64; else dqacc in place);
                            // at D = 64 the key side copies dKcorr into sDq and dU into U (v15)
  const T *K, *V, *Q, *dO;
  T *sK, *sV, *sQ, *sDO;
  if constexpr (Tiles::kInSmem) {
    W = sRows + C;
    bW = W + C * LD;
    U = bW + C * LD;
    sDq = U + C * LD;
    sK = reinterpret_cast<T*>(sDq + C * LD);
    sV = sK + C * LD;
    sQ = sV + C * LD;
    sDO = sQ + C * LD;
  } else {
    W = tile(kW);
    bW = tile(kBW);
    U = tile(kU);
    sDq = nullptr;
    sK = reinterpret_cast<T*>(tile(kK));
    sV = reinterpret_cast<T*>(tile(kV));
    sQ = reinterpret_cast<T*>(tile(kQ));
    sDO = reinterpret_cast<T*>(tile(kDO));
  }
  K = sK;
  V = sV;
  Q = sQ;
  dO = sDO;
  float *dU = tile(kDU), *dbW = tile(kDBW), *dW = tile(kDW);
  float* dKc = tile(kDKc);  // [C][C]  d Kcorr
  const int tid = threadIdx.x;

  // v26 (D = 64): the 16-bit K, V, Q, dO tiles and the f32 dQ^ tile of the next (task, query head) are copied into
  // shared memory by cp.async as soon as the current one has last read each tile (Q, dO, V after the last head's
  // products; K and dQ^ after the key side's last products that read them; a next head's Q, dO, dQ^ after the head
  // before it), so that the staging at the next task (and head) waits for nothing but W (and lse2, delta): each tile
  // staged through registers was one memory latency with every warp at the barrier after it, ~6 a task (ncu: global
  // memory waits were the largest stall reason, docs/perf/notes.md v26). Q and dO only where their rows are 16-byte
  // aligned (params.h local_qdo_async); K, V and the workspace always are (api.cu).
  constexpr bool async = Tiles::kInSmem;
  const int num_tasks = p.num_chunks * p.H;
  const bool qdo_async = async && p.local_qdo_async;
  // The copies of task tk's K and V (as asked), and of its query head j's Q, dO (qdo) and dQ^ (dq).
  auto issue = [&](int tk, int j, bool kv_k, bool kv_v, bool qdo, bool dq) {
    const int gc = tk / p.H, hh = tk % p.H, hq = hh * p.group + j;
    const ChunkInfo c = p.chunks[gc];
    const int64_t t0 = c.t0;
    if (kv_k) copy_rows_async<D>(sK, LD, static_cast<const T*>(p.k) + c.b * p.sk.b + t0 * p.sk.t + hh * p.sk.h, p.sk.t, c.len);
    if (kv_v) copy_rows_async<D>(sV, LD, static_cast<const T*>(p.v) + c.b * p.sv.b + t0 * p.sv.t + hh * p.sv.h, p.sv.t, c.len);
    if (qdo) {
      copy_rows_async<D>(sQ, LD, static_cast<const T*>(p.q) + c.b * p.sq.b + t0 * p.sq.t + hq * p.sq.h, p.sq.t, c.len);
      copy_rows_async<D>(sDO, LD, static_cast<const T*>(p.dout) + c.b * p.sdo.b + t0 * p.sdo.t + hq * p.sdo.h, p.sdo.t, c.len);
    }
    if (dq) copy_rows_async<D>(sDq, LD, static_cast<const float*>(p.dqacc) + ((int64_t)gc * p.HQ + hq) * C * D, (int64_t)D, c.len);
    cp_async_commit();
  };
  if (async && (int)blockIdx.x < num_tasks) issue(blockIdx.x, 0, true, true, qdo_async, true);  // the first task's

  for (int task = blockIdx.x; task < num_tasks; task += gridDim.x) {
    const int gc = task / p.H, h = task % p.H;
    const ChunkInfo ci = p.chunks[gc];
    const int n = ci.len;
    const int64_t fac = (int64_t)gc * p.H + h;
    __syncthreads();  // the previous task is done with every tile

    // ---- Stage the chunk's rows (f32, zero past n) and recompute its factors (Eq. 10, 12).
    if (tid < C) {
      sBeta[tid] = tid < n ? p.beta[ci.b * p.sbeta.b + (int64_t)(ci.t0 + tid) * p.sbeta.t + h * p.sbeta.h] : 0.f;
      sDbeta[tid] = 0.f;
    }
    {
      const int64_t row_w = ci.b * p.sw.b + (int64_t)ci.t0 * p.sw.t + h * p.sw.h;
      const auto k_step = stage_step<D>(sK, LD, static_cast<const T*>(p.k) + ci.b * p.sk.b + (int64_t)ci.t0 * p.sk.t + h * p.sk.h, p.sk.t, n);
      const auto v_step = stage_step<D>(sV, LD, static_cast<const T*>(p.v) + ci.b * p.sv.b + (int64_t)ci.t0 * p.sv.t + h * p.sv.h, p.sv.t, n);
      if constexpr (async) {  // K and V are in flight (v26): W alone, then the wait
        if (p.w_is_bf16)
          stage_together<D>(stage_step<D>(W, LD, static_cast<const __nv_bfloat16*>(p.w) + row_w, p.sw.t, n));
        else
          stage_together<D>(stage_step<D>(W, LD, static_cast<const float*>(p.w) + row_w, p.sw.t, n));
        cp_async_wait<0>();
      } else if (p.w_is_bf16) {
        stage_together<D>(stage_step<D>(W, LD, static_cast<const __nv_bfloat16*>(p.w) + row_w, p.sw.t, n), k_step, v_step);
      } else {
        stage_together<D>(stage_step<D>(W, LD, static_cast<const float*>(p.w) + row_w, p.sw.t, n), k_step, v_step);
      }
    }
    __syncthreads();
    for (int e = tid; e < C * D; e += kThreads) {
      const int r = e / D, d = e % D;
      bW[r * LD + d] = round_if<kR>(sBeta[r] * W[r * LD + d]);
    }
    if (!(p.timing_skip & 256)) {
      mm_nosync<NW, C, D, kNone | X, kAKBK>(sT, LC, W, LD, W, LD, 1.f, false);  // W W^T
      mm<NW, C, D, kB | X, kAKBK>(s1, LC, W, LD, K, LD, 1.f, false);   // W K^T
      for (int e = tid; e < C * C; e += kThreads) {  // A = b strict_lower(W W^T), Y = b strict_lower(W K^T)
        const int i = e / C, j = e % C;
        sT[i * LC + j] = j < i ? sBeta[i] * sT[i * LC + j] : 0.f;
        s1[i * LC + j] = j < i ? round_if<kR>(sBeta[i] * s1[i * LC + j]) : 0.f;
    }
    __syncthreads();
    // T = (I + A)^{-1} in place (Eq. 10), the preprocess's blocked tensor-core solve (ut_solve.cuh); ends with a
    // barrier. Then rounded to TF32 where its readers take it as exact (kR).
    if (!(p.timing_skip & 16)) ut_solve_tc<LC>(sT);
    if constexpr (kR) {
      for (int e = tid; e < C * C; e += kThreads) sT[(e / C) * LC + e % C] = tf32(sT[(e / C) * LC + e % C]);
      __syncthreads();
    }
    mm_nosync<NW, C, C, kNone | X | RA | RB | RC, kAK>(sKc, LC, sT, LC, s1, LC, 1.f, false);  // Kcorr = T Y
    mm<NW, D, C, kNone | X | RA | RB | RC, kAK>(U, LD, sT, LC, bW, LD, 1.f, false);     // U = T b W
    }

    // ---- The chunk product P = I - W^T U (Eq. 11): dW = -U dP^T, dU = -W dP (Eq. 34).
    float* dk = p.dkacc + fac * C * D;
    if (!(p.timing_skip & 128)) {
      // The B operands dP and dK^ (written by the main kernel, in L2 or DRAM by now): at D = 64 copied first into
      // two idle C x C tiles (s2, s3; C = D), one load wave each, so that the four products read shared memory
      // instead of waiting for global memory in every k batch (v15, docs/perf/notes.md: these four products took
      // ~10 of bwd_local's 44 ms, twice the per-product time of the shared-memory ones). The same values, so the
      // same bits. At D = 128 dP (D x D) does not fit a tile, and the operands live in global scratch anyway.
      const float* dP = p.dpacc + fac * D * D;
      const float* dKh = dk;
      int ldp = D, ldk = D;
      if constexpr (Tiles::kInSmem) {
        static_assert(C == D, "dP and dK^ as [C, D] tiles");
        stage_together<D>(stage_step<D, kS>(s2, LC, dP, (int64_t)D, C),
                          stage_step<D, kS>(s3, LC, static_cast<const float*>(dk), (int64_t)D, C));
        __syncthreads();
        dP = s2;
        dKh = s3;
        ldp = ldk = LC;
      }
      mm_nosync<NW, D, D, kNone | X | RA | SB, kAKBK>(dW, D, U, LD, dP, ldp, -1.f, false);
      mm<NW, D, D, kNone | X | SB, kAK>(dU, D, W, LD, dP, ldp, -1.f, false);
      // ---- K^ = K - Kcorr^T W (Eq. 14): dk += dK^ (dkacc holds dK^ and becomes dk), dKcorr = -W dK^^T,
      // dW -= Kcorr dK^ (Eq. 29).
      mm_nosync<NW, C, D, kNone | X | SB, kAKBK>(dKc, C, W, LD, dKh, ldk, -1.f, false);
      mm<NW, D, C, kNone | X | RA | SB, kAK>(dW, D, sKc, LC, dKh, ldk, -1.f, true);
    }

    // ---- Per query head: the diagonal block and the query side (Eq. 12, 13, 24-28).
    for (int j = 0; j < ((p.timing_skip & 32) ? 0 : p.group); ++j) {
      const int hq = h * p.group + j;
      const int64_t qrow = (int64_t)gc * p.HQ + hq;
      const auto q_step = stage_step<D>(sQ, LD, static_cast<const T*>(p.q) + ci.b * p.sq.b + (int64_t)ci.t0 * p.sq.t + hq * p.sq.h, p.sq.t, n);
      const auto do_step = stage_step<D>(sDO, LD, static_cast<const T*>(p.dout) + ci.b * p.sdo.b + (int64_t)ci.t0 * p.sdo.t + hq * p.sdo.h, p.sdo.t, n);
      // dQ^ (Eq. 21) of this head: into shared memory at D = 64 (written out as dq below), else dqacc in place
      float* dq = p.dqacc + qrow * C * D;
      int ldq = D;
      if constexpr (async) {  // (D = 64) dQ^, and Q and dO where aligned, are in flight (v26)
        if (!qdo_async) stage_together<D>(q_step, do_step);
        cp_async_wait<0>();
        dq = sDq;
        ldq = LD;
      } else {
        stage_together<D>(q_step, do_step);
      }
      if (tid < C) {
        sLse2[tid] = p.lse2[qrow * C + tid];
        sDelta[tid] = p.delta[qrow * C + tid];
        sG[tid] = kGate ? p.ws.gl[qrow * C + tid] : 0.f;
      }
      __syncthreads();
      mm_nosync<NW, C, D, kA | X, kAKBK>(s0, LC, Q, LD, W, LD, 1.f, false);    // Q W^T
      mm16_nosync<NW, C, D>(s1, LC, Q, LD, K, LD, 1.f, false);  // Q K^T (16-bit operands: mm16_nosync)
      __syncthreads();
      mask2<kR>(s0, s1, [](int i, int jj) { return jj <= i; });  // QWl = lower(Q W^T), lower(Q K^T)
      mm_nosync<NW, C, C, kNone | X | RA | RB, kAK>(s1, LC, s0, LC, sKc, LC, -1.f, true);  // S -= QWl Kcorr (Eq. 12)
      mm16_nosync<NW, C, D>(s2, LC, dO, LD, V, LD, 1.f, false);    // dO V^T
      __syncthreads();
      // P = exp(l - lse) and dl = P (dO V^T - delta) on the causal part (Eq. 19-20); in base 2.
      for (int e = tid; e < C * C; e += kThreads) {
        const int i = e / C, jj = e % C;
        float pr = 0.f;
        if (jj <= i && i < n) pr = exp2f(s1[i * LC + jj] * p.scale_log2 + (sG[i] - sG[jj]) * kLog2e - sLse2[i]);
        s1[i * LC + jj] = round_if<kR>(pr);
        s2[i * LC + jj] = pr * (s2[i * LC + jj] - sDelta[i]);
      }
      __syncthreads();
      mm_nosync<NW, D, C, kB | X | RA, kANBN>(p.dvacc + fac * C * D, D, s1, LC, dO, LD, 1.f, true);  // dV += P^T dO (Eq. 5)
      mm<NW, C, D, kNone | X | RB, kAKBK>(s3, LC, dq, ldq, U, LD, -1.f, false);  // Q^ = Q - QWl U: dQWl = -dQ^ U^T (Eq. 26)
      if constexpr (kGate) {
        // dG_t = sum_j dl_tj - sum_i dl_it (Eq. 7): the main kernel added the row sums over earlier key chunks
        // (dgrow) and stored minus the column sums over later query chunks (dgacc); this adds the diagonal block's.
        // Both sums are formed explicitly, as the reference does: replacing the row sums by their exact value dlse
        // (sum_j P_tj = 1) left the rounding of every column sum uncancelled in dg's reverse cumulative sum.
        row_sums(s2, sRows);
        if (tid < n) {
          float cs = 0.f;
          for (int i = 0; i < C; ++i) cs += s2[i * LC + tid];
          p.dgacc[qrow * C + tid] += p.dgrow[qrow * C + tid] + sRows[tid] - cs;
        }
        __syncthreads();  // the sums read dl before it is scaled in place below
      }
      for (int e = tid; e < C * C; e += kThreads)  // ds = scale dl (Eq. 6)
        s2[(e / C) * LC + e % C] = round_if<kR>(s2[(e / C) * LC + e % C] * p.scale);
      __syncthreads();
      mm_nosync<NW, D, C, kNone | X | RA, kANBN>(dU, D, s0, LC, dq, ldq, -1.f, true);  // dU -= QWl^T dQ^
      mm<NW, C, C, kNone | X | RA | RB, kANBN>(dKc, C, s0, LC, s2, LC, -1.f, true);  // S: dKcorr -= QWl^T dS (Eq. 27)
      mm_nosync<NW, D, C, kB | X | RA, kAK>(dq, ldq, s2, LC, K, LD, 1.f, true);  // dq += dQ^ (in place) + dS K
      mm<NW, C, C, kNone | X | RA | RB, kAKBK>(s3, LC, s2, LC, sKc, LC, -1.f, true);  // dQWl -= dS Kcorr^T
      mask<kR>(s3, [](int i, int jj) { return jj <= i; });
      mm_nosync<NW, D, C, kB | X | RA, kANBN>(dk, D, s2, LC, Q, LD, 1.f, true);   // dk += dS^T Q
      mm<NW, D, C, kNone | X | RA, kAK>(dq, ldq, s3, LC, W, LD, 1.f, true);  // QWl: dq += dQWl W (Eq. 28)
      mm<NW, D, C, kB | X | RA, kANBN>(dW, D, s3, LC, Q, LD, 1.f, true);  //      dW += dQWl^T Q
      stage_together<D>(write_step<D>(static_cast<T*>(p.dq) + ci.b * p.sdq.b + (int64_t)ci.t0 * p.sdq.t + hq * p.sdq.h, p.sdq.t,
                                      static_cast<const float*>(dq), ldq, n));
      if constexpr (Tiles::kInSmem) __syncthreads();  // the next head stages its dQ^ into sDq
      if constexpr (async) {  // v26: the next head's tiles, or after the last head the next task's Q, dO and V
        const bool last = j + 1 >= p.group;
        const int nt = last ? task + (int)gridDim.x : task;
        if (nt < num_tasks) issue(nt, last ? 0 : j + 1, false, last, qdo_async, !last);
      }
    }

    // ---- Key side: Kcorr = T Y, U = T b W, T = (I + A)^{-1} (Eq. 29, 30).
    if (!(p.timing_skip & 64)) {
      // dKcorr and dU, final now, read by two products each: at D = 64 copied into the tiles of dQ^ and U (neither
      // is read from here on), as dP and dK^ above (v15). Their barrier is M's product's.
      const float* dKcs = dKc;
      const float* dUs = dU;
      int ldkc = C, ldu = D;
      if constexpr (Tiles::kInSmem) {
        stage_together<D>(stage_step<D, kS>(sDq, LD, static_cast<const float*>(dKc), (int64_t)C, C),
                          stage_step<D, kS>(U, LD, static_cast<const float*>(dU), (int64_t)D, C));
        dKcs = sDq;
        dUs = U;
        ldkc = ldu = LD;
      }
      mm<NW, C, D, kB | X, kAKBK>(s1, LC, W, LD, K, LD, 1.f, false);  // M = W K^T
      for (int e = tid; e < C * C; e += kThreads) {       // Y = b strict_lower(M) again (not kept: shared memory)
        const int i = e / C, j = e % C;
        s3[i * LC + j] = j < i ? round_if<kR>(sBeta[i] * s1[i * LC + j]) : 0.f;
    }
    __syncthreads();
    mm_nosync<NW, C, C, kNone | X | RB | SA, kAKBK>(s0, LC, dKcs, ldkc, s3, LC, 1.f, false);   // dT = dKcorr Y^T
    mm<NW, C, C, kNone | X | RA | SB, kANBN>(s2, LC, sT, LC, dKcs, ldkc, 1.f, false);  // dY = T^T dKcorr
    strict_lower_beta_backward<kR>(s2, s1, sBeta, sDbeta);  // Y = b strict_lower(M): dbeta, then dM = b dY
    mm_nosync<NW, D, C, kB | X | RA, kAK>(dW, D, s2, LC, K, LD, 1.f, true);       // dW += dM K
    mm<NW, D, C, kNone | X | RA, kANBN>(dk, D, s2, LC, W, LD, 1.f, true);  // dk += dM^T W
    // v26: K and the copy of dKcorr in sDq are read no more: the next task's K and first dQ^ go in flight.
    if (async && task + (int)gridDim.x < num_tasks) issue(task + gridDim.x, 0, true, false, false, true);
    mm_nosync<NW, C, D, kNone | X | RB | RC | SA, kAKBK>(s0, LC, dUs, ldu, bW, LD, 1.f, true);    // dT += dU (b W)^T
    mm<NW, D, C, kNone | X | RA | SB, kANBN>(dbW, D, sT, LC, dUs, ldu, 1.f, false);  // d(bW) = T^T dU
    add_row_dots<D>(sDbeta, dbW, D, W, LD);
    for (int e = tid; e < C * D; e += kThreads) dW[e] += sBeta[e / D] * dbW[e];
    __syncthreads();
    mm_nosync<NW, C, C, kNone | X | RA | RB | RC, kANBN>(s2, LC, sT, LC, s0, LC, 1.f, false);  // T^T dT
    mm<NW, C, D, kNone | X, kAKBK>(s1, LC, W, LD, W, LD, 1.f, false);    // W W^T
    mm<NW, C, C, kNone | X | RA | RB, kAKBK>(s3, LC, s2, LC, sT, LC, -1.f, false);  // dA = -T^T dT T^T (Eq. 30)
    strict_lower_beta_backward<false>(s3, s1, sBeta, sDbeta);  // A = b strict_lower(W W^T): dbeta, then dN = b dA
    for (int e = tid; e < C * C; e += kThreads) {  // dN + dN^T
      const int i = e / C, j = e % C;
      s2[i * LC + j] = round_if<kR>(s3[i * LC + j] + s3[j * LC + i]);
    }
    __syncthreads();
    mm<NW, D, C, kNone | X | RA, kAK>(dW, D, s2, LC, W, LD, 1.f, true);  // dW += (dN + dN^T) W
    } else if (async && task + (int)gridDim.x < num_tasks) {  // (timing only: the key side left out)
      issue(task + gridDim.x, 0, true, false, false, true);
    }

    // ---- Final writes (rows of the chunk).
    const int64_t t0 = (int64_t)ci.t0;
    {
      const auto dk_step = write_step<D>(static_cast<T*>(p.dk) + ci.b * p.sdk.b + t0 * p.sdk.t + h * p.sdk.h, p.sdk.t,
                                         static_cast<const float*>(dk), D, n);
      const auto dv_step = write_step<D>(static_cast<T*>(p.dv) + ci.b * p.sdv.b + t0 * p.sdv.t + h * p.sdv.h, p.sdv.t,
                                         static_cast<const float*>(p.dvacc + fac * C * D), D, n);
      const int64_t row_dw = ci.b * p.sdw.b + t0 * p.sdw.t + h * p.sdw.h;
      if (p.w_is_bf16)
        stage_together<D>(dk_step, dv_step, write_step<D>(static_cast<__nv_bfloat16*>(p.dw) + row_dw, p.sdw.t, static_cast<const float*>(dW), D, n));
      else
        stage_together<D>(dk_step, dv_step, write_step<D>(static_cast<float*>(p.dw) + row_dw, p.sdw.t, static_cast<const float*>(dW), D, n));
    }
    __syncthreads();  // sDbeta: add_row_dots and the last strict_lower_beta_backward wrote it from other threads
    if (tid < n) p.dbeta[ci.b * p.sdbeta.b + (t0 + tid) * p.sdbeta.t + h * p.sdbeta.h] = sDbeta[tid];
  }
}

}  // namespace pathattn::cuda
