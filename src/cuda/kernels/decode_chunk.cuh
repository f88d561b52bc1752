// A decoding call of S >= 2 new tokens on the plain cache, one chunk of Eq. 17 per 64 tokens (docs/math.md §4,
// Eq. 10-14, 17, 43; docs/cuda.md "Decode"). The single step (kernels/decode.cuh) reads and rewrites the whole cache
// once per token; here a chunk of n <= 64 tokens reads every cached row once, attends to it with all n queries
// carried back to the chunk's start, and carries it over the chunk's UT factor in the same pass:
//   l_ij = scale q^_i . c_j + G_i - G_j   (j < L0),        c_j <- c_j - (c_j U^T) W                     (Eq. 43)
// where L0 = lengths[b] + the tokens of earlier chunks of the call. This is the CPU decode's order
// (src/cpu/append.cpp), so the two agree to f32 rounding. Three kernels per chunk, f32 arithmetic on CUDA cores:
//   1. decode_chunk_prep_kernel, one block per (sequence, kv head): the chunk's UT factor (Eq. 10: T, U = T b W),
//      M = T b strict_lower(W K^T) (Eq. 12), the new keys carried to the chunk's end K^ = K - M^T W (Eq. 14),
//      appended with the values and G at rows L0 .. L0 + n - 1 (which no other kernel of the chunk reads); per query
//      head the queries carried to the chunk's start, Q^ = Q - lower(Q W^T) U (Eq. 13), and the chunk's attention to
//      itself (logits Eq. 12 plus the gate) as one more partial, slot num_splits.
//   2. decode_chunk_split_kernel, one block per (sequence, kv head, split): the split's cached rows in tiles of 64:
//      logits Q^ C^T + G_i - G_j, online softmax and P V per query row (the n x group rows of the kv head, in
//      passes of at most 64), and in the last pass the carry, stored (earlier passes read the rows uncarried).
//   3. decode_chunk_combine_kernel, one block per (sequence, query head, token): the num_splits + 1 partials merged
//      as the single step merges its splits (kernels/decode.cuh merge_partials); lengths advanced by n.
// A sequence that does not fit (lengths[b] < 0 or lengths[b] + S > Tmax) gets NaN o and lse and is left untouched,
// as in the single step. Without commit (p.commit false: speculative decoding's verification, one chunk) the same
// outputs, and no kernel writes the cache, its gates or the lengths: the prep does not append, the split kernel
// does not carry, the combine does not advance.
#pragma once

#include "cuda/kernels/decode.cuh"
#include "cuda/kernels/prep.cuh"  // prep_detail::tile_nt (the prep kernel)
#include "cuda/kernels/ut_solve.cuh"

namespace pathattn::cuda {

constexpr int kDecodeChunkThreads = 256;  // the tile products' 16 x 16 threads

// Partial slot of (sequence b, query head hq, token i of the chunk, split); split num_splits is the chunk itself.
__device__ __forceinline__ int64_t chunk_part(const DecodeParams& p, int b, int hq, int i, int split) {
  return ((static_cast<int64_t>(b) * p.HQ + hq) * p.chunk_rows + i) * (p.num_splits + 1) + split;
}

template <typename X>
__device__ __forceinline__ void store_cache1(void* base, int64_t off, float x) {
  if constexpr (std::is_same_v<X, float>)
    static_cast<float*>(base)[off] = x;
  else
    static_cast<X*>(base)[off] = TypeTraits<X>::from_float(x);
}

template <int D>
constexpr int decode_chunk_prep_smem_bytes() {
  return (5 * kChunk * (D + 1) + 3 * kChunk * (kChunk + 1) + kChunk) * 4 + kChunk * 8;
}

template <typename T, int D, typename KC, typename VC>
__global__ void __launch_bounds__(kDecodeChunkThreads) decode_chunk_prep_kernel(const DecodeParams p) {
  using namespace prep_detail;  // C = 64, LC = C + 1, tile_nt
  constexpr int LD = D + 1;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ float smem[];
  float* sW = smem;            // [C][LD] w rows (f32), zero past the chunk's n tokens
  float* sK = sW + C * LD;     // [C][LD] k rows
  float* sV = sK + C * LD;     // [C][LD] v rows
  float* sU = sV + C * LD;     // [C][LD] U = T b W
  float* sQ = sU + C * LD;     // [C][LD] one query head's rows
  float* sA = sQ + C * LD;     // [C][LC] A, then M
  float* sT = sA + C * LC;     // [C][LC] T, then one head's logits and probabilities
  float* sX = sT + C * LC;     // [C][LC] strict_lower(W K^T), then one head's lower(Q W^T)
  float* sBeta = sX + C * LC;  // [C]
  double* sG = reinterpret_cast<double*>(sBeta + C);  // [C] one head's G of the new tokens (8-byte aligned: C even)

  const int b = static_cast<int>(blockIdx.x / p.H), h = static_cast<int>(blockIdx.x % p.H);
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16, warp = tid / 32, lane = tid % 32;
  const int t0 = p.step, n = p.chunk_n;
  const int64_t before = decode_len_before(p, b);
  if (before < 0 || before + p.S > p.Tmax) return;  // the combine kernel writes NaN
  const int L0 = static_cast<int>(before) + t0;
  const bool gate = p.g != nullptr;

  for (int e = tid; e < C * D; e += kDecodeChunkThreads) {
    const int r = e / D, d = e % D;
    float wv = 0.f, kv = 0.f, vv = 0.f;
    if (r < n) {
      const int64_t t = t0 + r;
      wv = load_w(p.w, b * p.sw.b + t * p.sw.t + h * p.sw.h + d, p.w_is_bf16);
      kv = TypeTraits<T>::to_float(static_cast<const T*>(p.k)[b * p.sk.b + t * p.sk.t + h * p.sk.h + d]);
      vv = TypeTraits<T>::to_float(static_cast<const T*>(p.v)[b * p.sv.b + t * p.sv.t + h * p.sv.h + d]);
    }
    sW[r * LD + d] = wv;
    sK[r * LD + d] = kv;
    sV[r * LD + d] = vv;
  }
  for (int r = tid; r < C; r += kDecodeChunkThreads)
    sBeta[r] = r < n ? p.beta[b * p.sbeta.b + static_cast<int64_t>(t0 + r) * p.sbeta.t + h * p.sbeta.h] : 0.f;
  __syncthreads();

  chunk_ut_factor<D>(sW, sK, sBeta, sA, sT, sX);  // A, X = strict_lower(W K^T), T = (I + A)^{-1} (Eq. 10, 12)

  // U = T b W (Eq. 10), kept here and stored with W (f32) for the split kernel's carry; M = T b X into sA (Eq. 12).
  const int64_t uw0 = (static_cast<int64_t>(b) * p.H + h) * C * D;
  for (int e = tid; e < C * D; e += kDecodeChunkThreads) {
    const int i = e / D, d = e % D;
    float s = 0.f;
    for (int l = 0; l <= i; ++l) s = fmaf(sT[i * LC + l] * sBeta[l], sW[l * LD + d], s);
    sU[i * LD + d] = s;
    p.chunk_u[uw0 + e] = s;
    p.chunk_w[uw0 + e] = sW[i * LD + d];
  }
  for (int e = tid; e < C * C; e += kDecodeChunkThreads) {
    const int i = e / C, j = e % C;
    float s = 0.f;
    for (int l = j + 1; l <= i; ++l) s = fmaf(sT[i * LC + l] * sBeta[l], sX[l * LC + j], s);
    sA[i * LC + j] = s;
  }
  __syncthreads();

  // Append: K^ = K - M^T W (Eq. 14), k^_j = k_j - sum_{i > j} M[i][j] w_i, carried to the chunk's last token; the
  // values as given.
  for (int e = tid; p.commit && e < n * D; e += kDecodeChunkThreads) {
    const int j = e / D, d = e % D;
    float s = sK[j * LD + d];
    for (int i = j + 1; i < n; ++i) s = fmaf(-sA[i * LC + j], sW[i * LD + d], s);
    store_cache1<KC>(p.ck, b * p.sck.b + static_cast<int64_t>(L0 + j) * p.sck.t + h * p.sck.h + d, s);
    store_cache1<VC>(p.cv, b * p.scv.b + static_cast<int64_t>(L0 + j) * p.scv.t + h * p.scv.h + d, sV[j * LD + d]);
  }

  for (int g = 0; g < p.group; ++g) {
    const int hq = h * p.group + g;
    __syncthreads();  // the previous head's readers of sQ, sX, sT and sG are done
    for (int e = tid; e < C * D; e += kDecodeChunkThreads) {
      const int r = e / D, d = e % D;
      sQ[r * LD + d] =
          r < n ? TypeTraits<T>::to_float(
                      static_cast<const T*>(p.q)[b * p.sq.b + static_cast<int64_t>(t0 + r) * p.sq.t + hq * p.sq.h + d])
                : 0.f;
    }
    if (gate && tid == 0) {  // G continues from the last cached token (Eq. 2), in f64 (docs/spec.md §6)
      const int64_t goff = b * p.scg.b + hq * p.scg.h;
      double G = L0 > 0 ? load_gcum(p, goff + static_cast<int64_t>(L0 - 1) * p.scg.t) : 0.0;
      for (int i = 0; i < n; ++i) {
        G += static_cast<double>(p.g[b * p.sg.b + static_cast<int64_t>(t0 + i) * p.sg.t + hq * p.sg.h]);
        sG[i] = G;
        p.chunk_g[(static_cast<int64_t>(b) * p.HQ + hq) * C + i] = G;
        if (p.commit) store_gcum(p, goff + static_cast<int64_t>(L0 + i) * p.scg.t, G);
      }
    }
    __syncthreads();
    // QW = lower(Q W^T) (diagonal included, Eq. 13) into sX; Q K^T in registers.
    tile_nt_lower<D>(sQ, LD, sW, LD, sX, LC, true);
    float qk[4][4];
    tile_nt<D>(sQ, LD, sK, LD, qk);
    __syncthreads();
    // Q^ = Q - QW U (Eq. 13): the queries carried back to the chunk's start, for the split kernel.
    float* qhat = p.chunk_q + (static_cast<int64_t>(b) * p.HQ + hq) * C * D;
    for (int e = tid; e < n * D; e += kDecodeChunkThreads) {
      const int i = e / D, d = e % D;
      float s = sQ[i * LD + d];
      for (int l = 0; l <= i; ++l) s = fmaf(-sX[i * LC + l], sU[l * LD + d], s);
      qhat[e] = s;
    }
    // The chunk's own logits (Eq. 12): S_ij = q_i . k_j - sum_{j < l <= i} QW[i][l] M[l][j] for j <= i (S_ii =
    // q_i . k_i: a key is not carried by its own H), in base 2 with the gate, into sT.
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = ty + 16 * a, j = tx + 16 * c;
        float lg = -INFINITY;
        if (i < n && j <= i) {
          float s = qk[a][c];
          for (int l = j + 1; l <= i; ++l) s = fmaf(-sX[i * LC + l], sA[l * LC + j], s);
          lg = s * p.scale_log2;
          if (gate) lg += static_cast<float>(sG[i] - sG[j]) * kLog2e;
        }
        sT[i * LC + j] = lg;
      }
    __syncthreads();
    // Softmax per row (one warp per row, two columns per lane): its max and sum are the partial's; P into sT.
    for (int i = warp; i < n; i += kDecodeChunkThreads / 32) {
      const float x0 = sT[i * LC + lane], x1 = sT[i * LC + lane + 32];
      float m = fmaxf(x0, x1);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const float p0 = exp2f(x0 - m), p1 = exp2f(x1 - m);  // m is finite (the diagonal); masked: 0
      float l = p0 + p1;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
      sT[i * LC + lane] = p0;
      sT[i * LC + lane + 32] = p1;
      if (lane == 0) {
        const int64_t part = chunk_part(p, b, hq, i, p.num_splits);
        p.part_ml[part * 2] = m;
        p.part_ml[part * 2 + 1] = l;
      }
    }
    __syncthreads();
    for (int e = tid; e < n * D; e += kDecodeChunkThreads) {
      const int i = e / D, d = e % D;
      float s = 0.f;
      for (int j = 0; j <= i; ++j) s = fmaf(sT[i * LC + j], sV[j * LD + d], s);
      p.part_o[chunk_part(p, b, hq, i, p.num_splits) * D + d] = s;
    }
  }
}

// The split kernel's tiles: the products' operands are stored so that each thread reads its rows and its columns
// as one vector per k (LDS.64 / LDS.128): transposed ([k][row], row length kLQ) for the k-sums over D, row-major
// ([row][d], row length D + 4) for the values and W. The first form (tile_nt, rows ty + 16 a, scalar loads: 8 loads
// per 16 FMAs) ran at ~13 TFLOP/s on an H100, bound by shared-memory loads.
constexpr int kLQ = kChunk + 4;  // 16-byte aligned rows
template <int D>
constexpr int decode_chunk_split_smem_bytes() {
  return (3 * D * kLQ + 2 * kChunk * (D + 4) + kChunk * kLQ) * 4 + kChunk * 8;
}

// N consecutive floats of shared memory (4 N-byte aligned) into registers: one LDS.32 / .64 / .128.
template <int N>
__device__ __forceinline__ void lds_vec(const float* p, float (&x)[N]) {
  if constexpr (N == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else if constexpr (N == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x, x[1] = v.y;
  } else {
    static_assert(N == 1, "1, 2 or 4");
    x[0] = *p;
  }
}

// acc[a][c] = sum_k XT[k][ty kRA + a] YT[k][tx kCB + c]: a (16 kRA) x (16 kCB) block of X Y^T from transposed
// operands, kRA x kCB per thread of a 16 x 16 grid (ty = tid / 16, tx = tid % 16).
template <int K, int kRA, int kCB>
__device__ __forceinline__ void tile_tt(const float* XT, int ldx, const float* YT, int ldy, float (&acc)[kRA][kCB]) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int a = 0; a < kRA; ++a)
#pragma unroll
    for (int c = 0; c < kCB; ++c) acc[a][c] = 0.f;
#pragma unroll 8
  for (int k = 0; k < K; ++k) {
    float x[kRA], y[kCB];
    lds_vec<kRA>(XT + k * ldx + ty * kRA, x);
    lds_vec<kCB>(YT + k * ldy + tx * kCB, y);
#pragma unroll
    for (int a = 0; a < kRA; ++a)
#pragma unroll
      for (int c = 0; c < kCB; ++c) acc[a][c] = fmaf(x[a], y[c], acc[a][c]);
  }
}

// KC, VC: the cache's key and value types (as decode_split_kernel's). kA: query rows per thread and pass (1, 2 or 4:
// 16 kA rows per pass, decode_chunk_row_groups), so that a short chunk (n x HQ / H <= 16 or 32 rows, speculative
// decoding's few tokens) computes only its rows' logits and P V and only its tokens' columns of X = C U^T
// (n <= 16 kA). Thread (ty, tx) holds query rows ty kA + a, cached rows (logits) 4 tx + c, output columns
// 64 q + 4 tx + c, and in the carry cached rows 4 ty + a.
template <typename T, int D, typename KC, typename VC, int kA>
__global__ void __launch_bounds__(kDecodeChunkThreads) decode_chunk_split_kernel(const DecodeParams p) {
  constexpr int C = kChunk, LQ = kLQ, LV = D + 4;
  constexpr int kNQ = D / 64;     // 64-column groups of the output (float4 per thread each)
  constexpr int kRows = 16 * kA;  // query rows per pass
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ float smem[];  // 16-byte aligned (dynamic shared memory)
  float* sQT = smem;           // [D][LQ] this pass's query rows, transposed: q^ scale log2(e) (base-2 logits)
  float* sCT = sQT + D * LQ;   // [D][LQ] a tile of cached keys (f32), transposed
  float* sUT = sCT + D * LQ;   // [D][LQ] the chunk's U, transposed
  float* sV = sUT + D * LQ;    // [C][LV] the tile's values
  float* sW = sV + C * LV;     // [C][LV] the chunk's W
  float* sP = sW + C * LV;     // [C][LQ] P^T (cached row x query row), then X^T (token x cached row)
  double* sG = reinterpret_cast<double*>(sP + C * LQ);  // [C] G of each query row of the pass

  const SplitBlock sb = decode_split_block<false>(p);
  if (!sb.ok) return;  // the combine kernel writes NaN
  const int b = sb.b, h = sb.h, split = sb.split, r0 = sb.r0, r1 = sb.r1;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int n = p.chunk_n, R = n * p.group;  // query rows of the kv head: row r is token r % n of head r / n
  const int passes = (R + kRows - 1) / kRows;
  const bool gate = p.g != nullptr;
  const int64_t uw0 = (static_cast<int64_t>(b) * p.H + h) * C * D;
  for (int e = tid; e < C * D; e += kDecodeChunkThreads) {
    const int i = e / D, d = e % D;
    sUT[d * LQ + i] = p.chunk_u[uw0 + e];
    sW[i * LV + d] = p.chunk_w[uw0 + e];
  }
  const int64_t ck0 = b * p.sck.b + h * p.sck.h, cv0 = b * p.scv.b + h * p.scv.h;

  for (int pass = 0; pass < passes; ++pass) {
    const bool carry = p.commit && pass == passes - 1;  // the last pass carries and stores the rows
    __syncthreads();  // the previous pass's readers of sQT and sG are done
    for (int e = tid; e < kRows * D; e += kDecodeChunkThreads) {
      const int r = e / D, d = e % D, qr = pass * kRows + r;
      float x = 0.f;
      if (qr < R) {
        const int hq = h * p.group + qr / n, i = qr % n;
        x = p.chunk_q[((static_cast<int64_t>(b) * p.HQ + hq) * C + i) * D + d] * p.scale_log2;
      }
      sQT[d * LQ + r] = x;
    }
    if (gate)
      for (int r = tid; r < kRows; r += kDecodeChunkThreads) {
        const int qr = pass * kRows + r;
        sG[r] = qr < R ? p.chunk_g[(static_cast<int64_t>(b) * p.HQ + h * p.group + qr / n) * C + qr % n] : 0.0;
      }
    // This thread's query rows ty kA + a: running max (base 2), sum, and unnormalised o at columns 64 q + 4 tx + c.
    float m[kA], l[kA], o[kA][kNQ][4];
    int64_t goff[kA];
#pragma unroll
    for (int a = 0; a < kA; ++a) {
      m[a] = -INFINITY;
      l[a] = 0.f;
#pragma unroll
      for (int q = 0; q < kNQ; ++q)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[a][q][c] = 0.f;
      const int qr = min(pass * kRows + ty * kA + a, R - 1);
      goff[a] = b * p.scg.b + (h * p.group + qr / n) * p.scg.h;
    }

    for (int base = r0; base < r1; base += C) {  // uniform over the block
      const int nr = min(C, r1 - base);
      __syncthreads();  // the previous tile's readers of sCT, sV and sP are done (first: sQT, sG are published)
      for (int e = tid; e < C * (D / 4); e += kDecodeChunkThreads) {
        const int j = e / (D / 4), d = 4 * (e % (D / 4));
        float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
        if (j < nr) {
          kv = cache_raw_to_float4<KC>(load_cache_raw4<KC>(p.ck, ck0 + static_cast<int64_t>(base + j) * p.sck.t + d));
          vv = cache_raw_to_float4<VC>(load_cache_raw4<VC>(p.cv, cv0 + static_cast<int64_t>(base + j) * p.scv.t + d));
        }
        sCT[(d + 0) * LQ + j] = kv.x;
        sCT[(d + 1) * LQ + j] = kv.y;
        sCT[(d + 2) * LQ + j] = kv.z;
        sCT[(d + 3) * LQ + j] = kv.w;
        *reinterpret_cast<float4*>(sV + j * LV + d) = vv;
      }
      __syncthreads();
      {
        float acc[kA][4];
        tile_tt<D, kA, 4>(sQT, LQ, sCT, LQ, acc);  // logits: query rows ty kA + a, cached rows 4 tx + c
#pragma unroll
        for (int a = 0; a < kA; ++a) {
          const int r = ty * kA + a;
          float mt = -INFINITY;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int j = 4 * tx + c;
            float s = acc[a][c];
            if (j >= nr)
              s = -INFINITY;
            else if (gate)
              s += static_cast<float>(sG[r] - load_gcum(p, goff[a] + static_cast<int64_t>(base + j) * p.scg.t)) *
                   kLog2e;
            acc[a][c] = s;
            mt = fmaxf(mt, s);
          }
#pragma unroll
          for (int off = 8; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));  // 16 tx lanes
          const float mn = fmaxf(m[a], mt);  // finite: cached row 0 of the tile is a row
          const float corr = exp2f(m[a] - mn);
          float ps = 0.f;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float pr = exp2f(acc[a][c] - mn);
            sP[(4 * tx + c) * LQ + r] = pr;
            ps += pr;
          }
#pragma unroll
          for (int off = 8; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
          l[a] = l[a] * corr + ps;
          m[a] = mn;
#pragma unroll
          for (int q = 0; q < kNQ; ++q)
#pragma unroll
            for (int c = 0; c < 4; ++c) o[a][q][c] *= corr;
        }
      }
      __syncthreads();
#pragma unroll 4
      for (int j = 0; j < nr; ++j) {  // O += P V
        float pr[kA];
        lds_vec<kA>(sP + j * LQ + ty * kA, pr);
#pragma unroll
        for (int q = 0; q < kNQ; ++q) {
          float v[4];
          lds_vec<4>(sV + j * LV + 64 * q + 4 * tx, v);
#pragma unroll
          for (int a = 0; a < kA; ++a)
#pragma unroll
            for (int c = 0; c < 4; ++c) o[a][q][c] = fmaf(pr[a], v[c], o[a][q][c]);
        }
      }
      if (carry) {
        __syncthreads();  // sP's readers are done
        {
          float x[4][kA];
          tile_tt<D, 4, kA>(sCT, LQ, sUT, LQ, x);  // X = C U^T: cached rows 4 ty + a, tokens tx kA + c (n <= 16 kA)
#pragma unroll
          for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int c = 0; c < kA; ++c) sP[(tx * kA + c) * LQ + 4 * ty + a] = x[a][c];
        }
        __syncthreads();
        // C <- C - X W (Eq. 43): cached rows 4 ty + a, columns 64 q + 4 tx + c, stored.
        float cn[4][kNQ][4];
#pragma unroll
        for (int q = 0; q < kNQ; ++q)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            float rows[4];
            lds_vec<4>(sCT + (64 * q + 4 * tx + c) * LQ + 4 * ty, rows);
#pragma unroll
            for (int a = 0; a < 4; ++a) cn[a][q][c] = rows[a];
          }
        for (int i = 0; i < n; ++i) {
          float xr[4];
          lds_vec<4>(sP + i * LQ + 4 * ty, xr);
#pragma unroll
          for (int q = 0; q < kNQ; ++q) {
            float w[4];
            lds_vec<4>(sW + i * LV + 64 * q + 4 * tx, w);
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
              for (int c = 0; c < 4; ++c) cn[a][q][c] = fmaf(-xr[a], w[c], cn[a][q][c]);
          }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          const int j = 4 * ty + a;
          if (j >= nr) continue;
#pragma unroll
          for (int q = 0; q < kNQ; ++q)
            store_cache4<KC>(p.ck, ck0 + static_cast<int64_t>(base + j) * p.sck.t + 64 * q + 4 * tx,
                             make_float4(cn[a][q][0], cn[a][q][1], cn[a][q][2], cn[a][q][3]));
        }
      }
    }
    // This pass's partials (an empty split: m = -inf, l = 0, o = 0).
#pragma unroll
    for (int a = 0; a < kA; ++a) {
      const int qr = pass * kRows + ty * kA + a;
      if (qr >= R) continue;
      const int64_t part = chunk_part(p, b, h * p.group + qr / n, qr % n, split);
      if (tx == 0) {
        p.part_ml[part * 2] = m[a];
        p.part_ml[part * 2 + 1] = l[a];
      }
#pragma unroll
      for (int q = 0; q < kNQ; ++q)
        *reinterpret_cast<float4*>(p.part_o + part * D + 64 * q + 4 * tx) =
            make_float4(o[a][q][0], o[a][q][1], o[a][q][2], o[a][q][3]);
    }
  }
}

// The split kernel's 16-row groups per pass for a chunk of n tokens: 1, 2 or 4.
inline int decode_chunk_row_groups(int n, int group) {
  const int64_t rows = static_cast<int64_t>(n) * group;
  return rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
}

// One block of kCombineThreads per (sequence, query head) and token i of the chunk (blockIdx.y).
template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads) decode_chunk_combine_kernel(const DecodeParams p) {
  __shared__ float sw[kDecodeMaxSplits + 1];
  __shared__ float sred[kCombineThreads / 32];
  __shared__ float so[kCombineThreads / D][D];
  const int hq = static_cast<int>(blockIdx.x % p.HQ), b = static_cast<int>(blockIdx.x / p.HQ);
  const int i = static_cast<int>(blockIdx.y), t = p.step + i;
  T* o = static_cast<T*>(p.o) + b * p.so.b + t * p.so.t + hq * p.so.h;
  float* lse = p.lse + b * p.slse.b + t * p.slse.t + hq * p.slse.h;
  const int64_t before = p.len_snap[b];
  if (before < 0 || before + p.S > p.Tmax) {  // the other kernels left this sequence alone
    for (int d = threadIdx.x; d < D; d += kCombineThreads) o[d] = TypeTraits<T>::from_float(NAN);
    if (threadIdx.x == 0) *lse = NAN;
    return;
  }
  const int64_t part = chunk_part(p, b, hq, i, 0);
  merge_partials<T, D>(p.part_ml + part * 2, p.part_o + part * D, p.num_splits + 1, o, lse, sw, sred, so);
  if (p.commit && hq == 0 && i == 0 && threadIdx.x == 0)
    p.lengths[b * p.slen] = static_cast<int32_t>(before + p.step + p.chunk_n);
}

}  // namespace pathattn::cuda
