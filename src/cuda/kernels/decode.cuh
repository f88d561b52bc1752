// One decoding step on the GPU (docs/spec.md §4, docs/math.md Eq. 3, 4; docs/cuda.md "Decode"): token t of
// sequence b arrives with q_t, k_t, v_t, w_t, beta_t (and g_t); the cache holds rows j < L0 = lengths[b], every
// key carried to token t - 1 (keys f32 or bf16, values f32 or T; all arithmetic in f32). The step
//   1. carries every cached key over H_t:  c_j <- c_j - beta_t (w_t . c_j) w_t                       (Eq. 3)
//   2. attends:  l_tj = scale q_t . c_j + G_t - G_j for j < L0, and l_tt = scale q_t . k_t (the new key is not
//      carried by its own H_t: the query's H_t is in the product, the key's is not, docs/spec.md §1)   (Eq. 4)
//   3. appends k_t, v_t, G_t at row L0 and advances lengths[b].
// This is the CPU decode's order (src/cpu/append.cpp with one row: the query carried to the chunk start, H_t q_t,
// against the uncarried cache is the same logit as q_t against the carried cache), so it equals forward() over
// the longer sequence to rounding.
//
// decode_split_kernel: one block of 256 threads per (sequence, kv head, split); a split is a contiguous share of
// the L0 cached rows, L0 read from device memory inside the kernel (no host work depends on data: the launch
// pair can be captured in a CUDA graph). A team of D / 4 lanes owns one cached row at a time (a float4 per lane):
// it reads the key once, carries it, writes it back, and in the same pass forms the logits of all HQ / H query
// heads of the kv head (GQA: the cache is read once per kv head), with an online softmax in base 2 per head. The
// teams' states merge in shared memory into one partial (max, sum, unnormalised o) per (query head, split).
// Split 0 also holds the new token itself and appends it (no block reads row L0 during the launch).
// decode_combine_kernel: one block of D threads per (sequence, query head) merges the splits' partials by their
// maxima into o and lse, then advances lengths[b] (from the value the split kernel saw: lengths is read by every
// split block, so it can only change once they have all run).
//
// Everything is f32 on CUDA cores (no tensor cores: one query row per kv head is a matrix-vector product, bound
// by reading and writing the cache: 3 x 4 D bytes per cached row per kv head with f32 keys and values, 3 x 2 D with
// bf16 keys and T values). A sequence whose length does not
// fit (lengths[b] < 0 or lengths[b] + S > Tmax) gets NaN o and lse for all S tokens and is left untouched: the host
// cannot check values it does not read.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/decode_params.h"
#include "cuda/kernels/common.cuh"

namespace pathattn::cuda {

constexpr int kDecodeThreads = 256;  // threads of a split block: 16 (D = 64) or 8 (D = 128) teams of D / 4 lanes

// Sum over the kTeam lanes of a team (aligned groups of kTeam lanes of a warp); every lane gets the sum. All 32
// lanes of the warp must call it (the shuffles name the full warp).
template <int kTeam>
__device__ __forceinline__ float team_sum(float x) {
#pragma unroll
  for (int off = kTeam / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__device__ __forceinline__ float dot4(const float4& a, const float4& b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
__device__ __forceinline__ float4 axpy4(float a, const float4& x, const float4& y) {  // a x + y
  return make_float4(fmaf(a, x.x, y.x), fmaf(a, x.y, y.y), fmaf(a, x.z, y.z), fmaf(a, x.w, y.w));
}
__device__ __forceinline__ float4 scale4(float a, const float4& x) { return make_float4(a * x.x, a * x.y, a * x.z, a * x.w); }

// 4 consecutive elements of a bf16 / f16 row at element offset `off` (even: rows are 4-byte aligned, supports()).
template <typename T>
__device__ __forceinline__ float4 load4(const void* base, int64_t off) {
  const uint32_t* p = reinterpret_cast<const uint32_t*>(static_cast<const T*>(base) + off);
  const float2 a = TypeTraits<T>::unpack(p[0]), b = TypeTraits<T>::unpack(p[1]);
  return make_float4(a.x, a.y, b.x, b.y);
}

// 4 cache elements of type X (float, or bf16 / f16) at element offset `off` as loaded, before conversion: a float4,
// or 8 bytes of a 16-bit cache (one 8-byte load: cache rows are 8-byte aligned, as store_cache4's uint2 store
// needs). The prefetching split kernel holds its next rows in this form (half the registers of a 16-bit row as
// floats). The cache's types are template parameters of the kernel: a runtime choice between the two loads cost
// ~6% at large batches (decode v2, notes.md).
template <typename X>
using CacheRaw4 = std::conditional_t<std::is_same_v<X, float>, float4, uint2>;
template <typename X>
__device__ __forceinline__ CacheRaw4<X> load_cache_raw4(const void* base, int64_t off) {
  return *reinterpret_cast<const CacheRaw4<X>*>(static_cast<const X*>(base) + off);
}
template <typename X>
__device__ __forceinline__ float4 cache_raw_to_float4(const CacheRaw4<X>& r) {
  if constexpr (std::is_same_v<X, float>) {
    return r;
  } else {
    const float2 a = TypeTraits<X>::unpack(r.x), b = TypeTraits<X>::unpack(r.y);
    return make_float4(a.x, a.y, b.x, b.y);
  }
}
template <typename X>
__device__ __forceinline__ void store_cache4(void* base, int64_t off, const float4& x) {
  if constexpr (std::is_same_v<X, float>) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + off) = x;
  } else {
    uint2 u;
    u.x = TypeTraits<X>::pack(x.x, x.y);
    u.y = TypeTraits<X>::pack(x.z, x.w);
    *reinterpret_cast<uint2*>(static_cast<X*>(base) + off) = u;
  }
}

__device__ __forceinline__ double load_gcum(const DecodeParams& p, int64_t off) {
  return p.cg_f64 ? static_cast<const double*>(p.cg)[off] : static_cast<double>(static_cast<const float*>(p.cg)[off]);
}
__device__ __forceinline__ void store_gcum(const DecodeParams& p, int64_t off, double x) {
  if (p.cg_f64)
    static_cast<double*>(p.cg)[off] = x;
  else
    static_cast<float*>(p.cg)[off] = static_cast<float>(x);
}

// lengths[b] before the call, as every step's kernels read it: lengths itself at step 0 (no kernel has advanced it
// yet), later the snapshot step 0's split kernel saved (the combine kernel advances lengths at every step).
__device__ __forceinline__ int64_t decode_len_before(const DecodeParams& p, int b) {
  return p.step == 0 ? static_cast<int64_t>(p.lengths[b * p.slen]) : static_cast<int64_t>(p.len_snap[b]);
}

// Where a split block of the launch stands (both split kernels, kernels/decode.cuh and kernels/decode_mma.cuh):
// its (sequence, kv head, split) from blockIdx.x, and its cached rows [r0, r1) of the L0 rows before the new token.
// Step 0's block (b, 0, 0) saves lengths[b] for the later steps and the combine kernel (lengths itself may only
// change once every block has read it). ok == false: the call does not fit (lengths[b] < 0 or lengths[b] + S >
// Tmax) or the checkpointed cache is broken (ckpt_snap < 0); the block returns and the combine kernel writes NaN.
struct SplitBlock {
  int b, h, split, L0, ckpt, r0, r1;  // ckpt: rows [0, ckpt) are old (the checkpointed cache's; 0 in the plain one)
  bool ok;
};
template <bool kCkpt>
__device__ __forceinline__ SplitBlock decode_split_block(const DecodeParams& p) {
  SplitBlock s{};
  const int ns = p.num_splits;
  s.split = static_cast<int>(blockIdx.x % ns);
  const int bh = static_cast<int>(blockIdx.x / ns);
  s.h = bh % p.H;
  s.b = bh / p.H;
  const int64_t before = decode_len_before(p, s.b);
  if (p.step == 0 && s.h == 0 && s.split == 0 && threadIdx.x == 0) p.len_snap[s.b] = static_cast<int32_t>(before);
  s.ok = before >= 0 && before + p.S <= p.Tmax;
  if (!s.ok) return s;
  s.L0 = static_cast<int>(before) + p.step;
  if constexpr (kCkpt) {
    s.ckpt = p.ckpt_snap[s.b];
    if (s.ckpt < 0) {
      s.ok = false;
      return s;
    }
  }
  s.r0 = static_cast<int>(static_cast<int64_t>(s.L0) * s.split / ns);
  s.r1 = static_cast<int>(static_cast<int64_t>(s.L0) * (s.split + 1) / ns);
  return s;
}

// The block's states (running max in base 2, sum, unnormalised o per part and head of the pass starting at query
// head hp of kv head h) merged by their maxima into the split's partial, which the combine kernel reads. Every
// split writes one for each head of the group (an empty split: m = -inf, l = 0, o = 0). After a barrier that
// publishes ml and o; the caller's next barrier protects them from the next pass.
template <int kParts, int kG, int D>
__device__ __forceinline__ void write_split_partials(const DecodeParams& p, const float (&ml)[kParts][kG][2],
                                                     const float (&o)[kParts][kG][D], int b, int h, int hp, int split) {
  const int ns = p.num_splits;
  for (int e = threadIdx.x; e < kG * D; e += blockDim.x) {
    const int g = e / D, d = e % D;
    if (hp + g >= p.group) continue;
    float M = -INFINITY;
    for (int tm = 0; tm < kParts; ++tm) M = fmaxf(M, ml[tm][g][0]);
    float L = 0.f, O = 0.f;
    for (int tm = 0; tm < kParts; ++tm) {
      const float mt = ml[tm][g][0];
      const float wgt = mt == -INFINITY ? 0.f : exp2f(mt - M);
      L += wgt * ml[tm][g][1];
      O += wgt * o[tm][g][d];
    }
    const int64_t part = (static_cast<int64_t>(b) * p.HQ + h * p.group + hp + g) * ns + split;
    p.part_o[part * D + d] = O;
    if (d == 0) {
      p.part_ml[part * 2] = M;
      p.part_ml[part * 2 + 1] = L;
    }
  }
}

// kG: query heads per pass (a power of two >= the group, at most 8; larger groups take group / 8 passes, the
// later ones reading back the rows the first pass carried and wrote: each thread rereads only its own writes).
// KC, VC: the cache's key and value types (KC float or bf16: p.ck_bf16; VC float or T: p.cv_low). kCkpt: the
// checkpointed cache (kernels/decode_checkpoint.cuh): rows before the checkpoint are read with the carried-back
// query and neither carried nor written. kPrefetch (plain cache only): see kU below.
template <typename T, int D, int kG, typename KC, typename VC, bool kCkpt, bool kPrefetch = false>
__global__ void __launch_bounds__(kDecodeThreads, 2) decode_split_kernel(const DecodeParams p) {
  constexpr int kTeam = D / 4;                    // lanes per cached row (one float4 each)
  constexpr int kTeams = kDecodeThreads / kTeam;  // rows a block reads at once per unrolled slot
  // Rows per team per iteration: loads in flight against registers (f32 rows: 77-84% of the copy bandwidth at
  // B = 64). The prefetching instances (the default; PATHATTN_DECODE_PREFETCH=0 selects the others) load the next
  // iteration's rows (as loaded, converted where used) before this iteration's carry and logits, so the loads
  // overlap the arithmetic and its shuffle chains: 16-bit rows kU = 4 (2 at kG = 8) plus as many prefetched, f32
  // or mixed rows kU = 2 (1) plus 2 (1). Measured on the H200: 2-11% faster, f32 rows 82-90% at B = 64; a bf16
  // cache 45-50% either way, bound by the per-row team reductions (docs/perf/notes.md "Decode";
  // kernels/decode_mma.cuh is the tensor-core alternative). ptxas (prefetching instances): no spills at kG <= 4 but for f32 keys with 16-bit values at kG = 4
  // (96 bytes); at kG = 8 every instance spills, prefetching or not (84-228 bytes).
  static_assert(!kPrefetch || !kCkpt, "the prefetch is for the plain cache");
  constexpr bool k16 = sizeof(KC) == 2 && sizeof(VC) == 2;
  constexpr int kU = (kG >= 8 ? 2 : 4) / (kPrefetch && !k16 ? 2 : 1);
  using VHeld = std::conditional_t<kPrefetch, CacheRaw4<VC>, float4>;  // a value row until P V uses it
  constexpr int kPre = kPrefetch ? kU : 1;  // prefetch slots (unused by the other instances)
  constexpr float kLog2e = 1.4426950408889634f;
  __shared__ float sm_ml[kTeams][kG][2];          // each team's running max (base 2) and sum, per head
  __shared__ __align__(16) float sm_o[kTeams][kG][D];  // and its unnormalised o: 4 kG KB

  pdl_launch_dependents();  // the combine kernel may be scheduled now: it waits (pdl_wait) for this grid
  const SplitBlock sb = decode_split_block<kCkpt>(p);
  if (!sb.ok) return;  // the combine kernel writes NaN
  const int b = sb.b, h = sb.h, split = sb.split, L0 = sb.L0, ckpt = sb.ckpt, r0 = sb.r0, r1 = sb.r1;
  const int team = threadIdx.x / kTeam, lane = threadIdx.x % kTeam, d0 = 4 * lane;
  const int t = p.step;
  const bool first = split == 0;
  const bool gate = p.g != nullptr;

  // H_t's factors (Eq. 1), this lane's 4 dimensions.
  const int64_t woff = b * p.sw.b + t * p.sw.t + h * p.sw.h + d0;
  const float4 w4 = make_float4(load_w(p.w, woff, p.w_is_bf16), load_w(p.w, woff + 1, p.w_is_bf16),
                                load_w(p.w, woff + 2, p.w_is_bf16), load_w(p.w, woff + 3, p.w_is_bf16));
  const float beta = p.beta[b * p.sbeta.b + t * p.sbeta.t + h * p.sbeta.h];
  // The new key and value (split 0 only): appended at row L0, which no block of this launch reads.
  float4 knew = make_float4(0.f, 0.f, 0.f, 0.f), vnew = knew;
  if (first) {
    knew = load4<T>(p.k, b * p.sk.b + t * p.sk.t + h * p.sk.h + d0);
    vnew = load4<T>(p.v, b * p.sv.b + t * p.sv.t + h * p.sv.h + d0);
    if (team == 0) {
      store_cache4<KC>(p.ck, b * p.sck.b + L0 * p.sck.t + h * p.sck.h + d0, knew);
      store_cache4<VC>(p.cv, b * p.scv.b + L0 * p.scv.t + h * p.scv.h + d0, vnew);  // exact in T
    }
  }
  const int64_t ck0 = b * p.sck.b + h * p.sck.h + d0;  // row j at ck0 + j * sck.t
  const int64_t cv0 = b * p.scv.b + h * p.scv.h + d0;

  for (int hp = 0; hp < p.group; hp += kG) {
    const bool carry = hp == 0;  // the first pass carries each row over H_t and writes it back
    float4 q4[kG], qc4[kG], acc[kG];  // qc4: the query carried back to the checkpoint (Eq. 35)
    float m[kG], l[kG];
    double gt[kG];  // G_t per head (f64: G_t - G_j keeps its precision at long T, docs/spec.md §6)
    int64_t goff[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const bool valid = hp + g < p.group;
      const int hq = h * p.group + (valid ? hp + g : 0);
      q4[g] = valid ? scale4(p.scale_log2, load4<T>(p.q, b * p.sq.b + t * p.sq.t + hq * p.sq.h + d0))
                    : make_float4(0.f, 0.f, 0.f, 0.f);
      qc4[g] = q4[g];
      if constexpr (kCkpt)
        if (valid)
          qc4[g] = scale4(p.scale_log2, *reinterpret_cast<const float4*>(
                                            p.qcarried + (static_cast<int64_t>(b) * p.HQ + hq) * D + d0));
      goff[g] = b * p.scg.b + hq * p.scg.h;
      gt[g] = 0.0;
      if (gate) {
        // G continues from the last cached token (Eq. 2); the new row's G_t joins the cache.
        gt[g] = (L0 > 0 ? load_gcum(p, goff[g] + (L0 - 1) * p.scg.t) : 0.0) +
                static_cast<double>(p.g[b * p.sg.b + t * p.sg.t + hq * p.sg.h]);
        if (first && valid && threadIdx.x == 0) store_gcum(p, goff[g] + L0 * p.scg.t, gt[g]);
      }
      // The new token attends to itself (logit scale q_t . k_t, gate term 0): team 0 of split 0 starts with it.
      const float self = team_sum<kTeam>(dot4(q4[g], knew));
      const bool own = first && team == 0;
      m[g] = own ? self : -INFINITY;
      l[g] = own ? 1.f : 0.f;
      acc[g] = own ? vnew : make_float4(0.f, 0.f, 0.f, 0.f);
    }

    // The split's rows, kU per team per iteration; the loop bound is uniform over the block (the shuffles need
    // every lane), rows past r1 are masked. A team prefetches only rows it owns itself (row = base + u kTeams +
    // team for every base), so in the carrying pass a prefetched row is one no thread has written yet, and in a
    // later pass one this thread wrote before the pass's barrier.
    CacheRaw4<KC> pk[kPre];
    VHeld pv[kPre];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int rn = r0 + u * kTeams + team;
        pk[u] = rn < r1 ? load_cache_raw4<KC>(p.ck, ck0 + rn * p.sck.t) : CacheRaw4<KC>{};
        pv[u] = rn < r1 ? load_cache_raw4<VC>(p.cv, cv0 + rn * p.scv.t) : VHeld{};
      }
    }
    for (int base = r0; base < r1; base += kU * kTeams) {
      float4 c[kU];
      CacheRaw4<KC> craw[kU];
      VHeld vv[kU];
      int row[kU];
      bool ok[kU], old[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        row[u] = base + u * kTeams + team;
        ok[u] = row[u] < r1;
        old[u] = kCkpt && row[u] < ckpt;  // uniform over the team (one row)
        if constexpr (kPrefetch) {
          craw[u] = pk[u];
          vv[u] = pv[u];
        } else {
          craw[u] = ok[u] ? load_cache_raw4<KC>(p.ck, ck0 + row[u] * p.sck.t) : CacheRaw4<KC>{};
          c[u] = cache_raw_to_float4<KC>(craw[u]);
          vv[u] = ok[u] ? cache_raw_to_float4<VC>(load_cache_raw4<VC>(p.cv, cv0 + row[u] * p.scv.t)) : VHeld{};
        }
      }
      if constexpr (kPrefetch) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {  // the next iteration's rows
          const int rn = base + (kU + u) * kTeams + team;
          pk[u] = rn < r1 ? load_cache_raw4<KC>(p.ck, ck0 + rn * p.sck.t) : CacheRaw4<KC>{};
          pv[u] = rn < r1 ? load_cache_raw4<VC>(p.cv, cv0 + rn * p.scv.t) : VHeld{};
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) c[u] = cache_raw_to_float4<KC>(craw[u]);
      }
      if (carry) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const float a = team_sum<kTeam>(dot4(w4, c[u])) * beta;  // beta_t (w_t . c_j)
          if (!old[u]) {  // an old row stays at the checkpoint
            c[u] = axpy4(-a, w4, c[u]);
            if (ok[u]) store_cache4<KC>(p.ck, ck0 + row[u] * p.sck.t, c[u]);
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float s[kU], mt = -INFINITY;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          s[u] = team_sum<kTeam>(dot4(old[u] ? qc4[g] : q4[g], c[u]));
          if (gate && ok[u]) s[u] += static_cast<float>(gt[g] - load_gcum(p, goff[g] + row[u] * p.scg.t)) * kLog2e;
          s[u] = ok[u] ? s[u] : -INFINITY;
          mt = fmaxf(mt, s[u]);
        }
        const float mn = fmaxf(m[g], mt);
        if (mn != -INFINITY) {  // uniform over the team; no shuffles inside
          const float corr = exp2f(m[g] - mn);
          l[g] *= corr;
          acc[g] = scale4(corr, acc[g]);
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            const float pr = exp2f(s[u] - mn);  // 0 for masked rows
            l[g] += pr;
            if constexpr (kPrefetch)
              acc[g] = axpy4(pr, cache_raw_to_float4<VC>(vv[u]), acc[g]);
            else
              acc[g] = axpy4(pr, vv[u], acc[g]);
          }
          m[g] = mn;
        }
      }
    }

    // Merge the teams: one partial per (query head, split).
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (lane == 0) {
        sm_ml[team][g][0] = m[g];
        sm_ml[team][g][1] = l[g];
      }
      *reinterpret_cast<float4*>(&sm_o[team][g][d0]) = acc[g];
    }
    __syncthreads();
    write_split_partials<kTeams, kG, D>(p, sm_ml, sm_o, b, h, hp, split);
    __syncthreads();  // the next pass reuses the shared arrays
  }
}

// One block of kCombineThreads per (sequence, query head): o = sum_s 2^(m_s - M) o_s / L, lse = (M + log2 L) ln 2.
// Parallel over the splits: a loop over them with one dependent load per split cost about 0.8 us per split (L2
// latency), ~100 us of a 114 us step at B = 1, L = 16k with 128 splits (docs/perf/notes.md, decode v2). Here the
// weights 2^(m_s - M) go through shared memory once, and each output element's sum over the splits is shared by
// kCombineThreads / D threads whose loads do not depend on each other. Every split writes its partial (an empty one
// m = -inf, l = 0, o = 0: weight 0), so the sums need no branch. Fixed summation order: deterministic.
constexpr int kCombineThreads = 256;
template <int kThreads>
__device__ __forceinline__ float block_reduce(float x, float* red, bool is_max) {  // every thread gets the result
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, off);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  if (lane == 0) red[warp] = x;
  __syncthreads();
  x = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) x = is_max ? fmaxf(x, red[w]) : x + red[w];
  __syncthreads();  // red is reused by the next reduction
  return x;
}

// Merges ns partials (ml: [ns][2] max in base 2 and sum, po: [ns][D] unnormalised o) into o and lse (natural log).
// Every thread of a kCombineThreads block calls it; sw holds ns weights (shared), sred and so are its scratch. At
// least one partial has a finite max (the new token's own logit).
template <typename T, int D>
__device__ __forceinline__ void merge_partials(const float* ml, const float* po, int ns, T* o, float* lse, float* sw,
                                               float* sred, float (*so)[D]) {
  constexpr int kParts = kCombineThreads / D;  // threads per output element
  static_assert(kCombineThreads % D == 0, "D must divide the combine block");
  const int tid = threadIdx.x;
  float M = -INFINITY;
  for (int s = tid; s < ns; s += kCombineThreads) M = fmaxf(M, ml[2 * s]);
  M = block_reduce<kCombineThreads>(M, sred, true);
  float L = 0.f;
  for (int s = tid; s < ns; s += kCombineThreads) {
    const float ms = ml[2 * s];
    const float wgt = ms == -INFINITY ? 0.f : exp2f(ms - M);
    sw[s] = wgt;
    L += wgt * ml[2 * s + 1];
  }
  L = block_reduce<kCombineThreads>(L, sred, false);  // its barriers also publish sw
  const int d = tid % D, q = tid / D;
  float O = 0.f;
#pragma unroll 8
  for (int s = q; s < ns; s += kParts) O = fmaf(sw[s], po[static_cast<int64_t>(s) * D + d], O);
  so[q][d] = O;
  __syncthreads();
  if (q == 0) {
#pragma unroll
    for (int r = 1; r < kParts; ++r) O += so[r][d];
    o[d] = TypeTraits<T>::from_float(O / L);
    if (d == 0) *lse = (M + log2f(L)) * 0.6931471805599453f;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(const DecodeParams p) {
  __shared__ float sw[kDecodeMaxSplits];  // the splits' weights 2^(m_s - M)
  __shared__ float sred[kCombineThreads / 32];
  __shared__ float so[kCombineThreads / D][D];
  // Launched as a programmatic dependent of the split kernel (PATHATTN_DECODE_PDL=1, launch/decode_impl.cuh): its
  // blocks may be resident before the split kernel ends; everything below reads what that kernel wrote.
  pdl_wait();
  const int hq = static_cast<int>(blockIdx.x % p.HQ), b = static_cast<int>(blockIdx.x / p.HQ);
  const int t = p.step, ns = p.num_splits;
  T* o = static_cast<T*>(p.o) + b * p.so.b + t * p.so.t + hq * p.so.h;
  float* lse = p.lse + b * p.slse.b + t * p.slse.t + hq * p.slse.h;
  const int64_t before = p.len_snap[b];  // lengths[b] before the call
  if (before < 0 || before + p.S > p.Tmax ||
      (p.ckpt != nullptr && p.ckpt_snap[b] < 0)) {  // the split kernel left this sequence alone
    for (int d = threadIdx.x; d < D; d += kCombineThreads) o[d] = TypeTraits<T>::from_float(NAN);
    if (threadIdx.x == 0) *lse = NAN;
    return;
  }
  // Split 0 holds the new token's own logit, so the maximum is finite.
  const int64_t part = (static_cast<int64_t>(b) * p.HQ + hq) * ns;
  merge_partials<T, D>(p.part_ml + part * 2, p.part_o + part * D, ns, o, lse, sw, sred, so);
  if (hq == 0 && threadIdx.x == 0) p.lengths[b * p.slen] = static_cast<int32_t>(before + t + 1);
}

}  // namespace pathattn::cuda
