// Launches the key-cache suffix-product kernel (kernels/kcache.cuh): one CTA per (sequence, kv head).
#include "cuda/check.h"
#include "cuda/kernels/kcache.cuh"
#include "cuda/launch/launch.h"

namespace pathattn::cuda {

template <typename T, int D>
void launch_kcache(const FwdParams& p, cudaStream_t stream) {
  constexpr int bytes = kcache_smem_bytes<D>();
  CUDA_CHECK(cudaFuncSetAttribute(kcache_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kcache_kernel<T, D><<<dim3(p.num_seqs, p.H), 256, bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH("kcache_kernel");
}

template void launch_kcache<__nv_bfloat16, 64>(const FwdParams&, cudaStream_t);
template void launch_kcache<__nv_bfloat16, 128>(const FwdParams&, cudaStream_t);
template void launch_kcache<__half, 64>(const FwdParams&, cudaStream_t);
template void launch_kcache<__half, 128>(const FwdParams&, cudaStream_t);

}  // namespace pathattn::cuda
