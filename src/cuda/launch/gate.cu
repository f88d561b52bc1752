// Launches the two gate-cumulation kernels (kernels/gate.cuh).
#include "cuda/check.h"
#include "cuda/kernels/gate.cuh"
#include "cuda/launch/launch.h"

namespace pathattn::cuda {

void launch_gate(const FwdParams& p, cudaStream_t stream) {
  gate_chunk_kernel<<<dim3(p.num_chunks, p.HQ), kChunk, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH("gate_chunk_kernel");
  const int n = p.num_seqs * p.HQ;
  gate_offset_kernel<<<(n + 127) / 128, 128, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH("gate_offset_kernel");
}

}  // namespace pathattn::cuda
