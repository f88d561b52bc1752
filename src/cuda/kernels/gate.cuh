// The cumulative forget gate of PaTH-FoX (docs/math.md Eq. 2), split as docs/spec.md §6 asks so that G_i - G_j keeps
// its precision on long sequences: G_t = goff[chunk] + gl[t], with gl the f32 cumsum inside the chunk (at most
// 64 terms) and goff the f64 sum of the sequence's earlier chunks. The main kernel forms
// G_i - G_j = (goff_m - goff_c) + gl_i - gl_j, subtracting the large offsets in f64.
#pragma once

#include "cuda/params.h"

namespace pathattn::cuda {

// grid (NC, HQ), block kChunk: inclusive scan of g inside each chunk, and the chunk's total.
__global__ void __launch_bounds__(kChunk) gate_chunk_kernel(FwdParams p) {
  const int gc = blockIdx.x, hq = blockIdx.y, t = threadIdx.x, lane = t % 32, warp = t / 32;
  const ChunkInfo ci = p.chunks[gc];
  float x = t < ci.len ? p.g[ci.b * p.sg.b + (int64_t)(ci.t0 + t) * p.sg.t + hq * p.sg.h] : 0.f;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const float y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __shared__ float warp_total;
  if (t == 31) warp_total = x;
  __syncthreads();
  if (warp == 1) x += warp_total;
  p.ws.gl[((int64_t)gc * p.HQ + hq) * kChunk + t] = x;
  if (t == kChunk - 1) p.ws.gtot[(int64_t)gc * p.HQ + hq] = x;
}

// One thread per (sequence, query head): exclusive prefix sum of the chunk totals in f64.
__global__ void gate_offset_kernel(FwdParams p) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= p.num_seqs * p.HQ) return;
  const int s = idx / p.HQ, hq = idx % p.HQ;
  const SeqInfo si = p.seqs[s];
  double run = 0.0;
  for (int c = 0; c < si.count; ++c) {
    const int64_t at = (int64_t)(si.first + c) * p.HQ + hq;
    p.ws.goff[at] = run;
    run += p.ws.gtot[at];
  }
}

}  // namespace pathattn::cuda
