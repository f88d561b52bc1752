// Launches the gate's reverse cumulative sum (kernels/bwd_gate.cuh): one CTA per (sequence, query head).
#include "cuda/check.h"
#include "cuda/kernels/bwd_gate.cuh"
#include "cuda/launch/launch.h"

namespace pathattn::cuda {

void launch_bwd_gate(const BwdParams& p, cudaStream_t stream) {
  bwd_gate_kernel<<<dim3(p.num_seqs, p.HQ), kChunk, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH("bwd_gate_kernel");
}

}  // namespace pathattn::cuda
