// The gate's gradient from the per-position dG of the backward (docs/math.md Eq. 7).
#pragma once

#include "cuda/params.h"

namespace pathattn::cuda {

// dg_t = sum_{i >= t} dG_i over the sequence (Eq. 7): one CTA of C threads per (sequence, query head) walks its
// chunks from the last, each chunk a suffix sum in shared memory, the running total across chunks in f64.
__global__ void __launch_bounds__(kChunk) bwd_gate_kernel(const BwdParams p) {
  constexpr int C = kChunk;
  __shared__ double sx[C];
  const int seq = blockIdx.x, hq = blockIdx.y, t = threadIdx.x;
  const SeqInfo si = p.seqs[seq];
  double run = 0.0;
  for (int c = si.first + si.count - 1; c >= si.first; --c) {
    const ChunkInfo ci = p.chunks[c];
    sx[t] = t < ci.len ? p.dgacc[((int64_t)c * p.HQ + hq) * C + t] : 0.0;
    __syncthreads();
    double suffix = 0.0;
    for (int u = t; u < C; ++u) suffix += sx[u];
    if (t < ci.len) p.dg[ci.b * p.sdg.b + (int64_t)(ci.t0 + t) * p.sdg.t + hq * p.sdg.h] = static_cast<float>(run + suffix);
    __syncthreads();
    if (t == 0) sx[0] = suffix;  // the chunk's total
    __syncthreads();
    run += sx[0];
    __syncthreads();
  }
}

}  // namespace pathattn::cuda
