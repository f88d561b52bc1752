// Launches the UT preprocess: grid (chunks, kv heads). prep_kernel (all f32, 256 threads) when the key cache is
// wanted (its f32 copies feed the suffix products); prep_tc_kernel (TF32 tensor cores, 128 threads) otherwise.
#include "cuda/check.h"
#include "cuda/kernels/prep.cuh"
#include "cuda/kernels/prep_tc.cuh"
#include "cuda/launch/launch.h"

namespace pathattn::cuda {

template <typename T, int D>
void launch_prep(const FwdParams& p, cudaStream_t stream) {
  constexpr int bytes = prep_smem_bytes<D>();
  CUDA_CHECK(cudaFuncSetAttribute(prep_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  prep_kernel<T, D><<<dim3(p.num_chunks, p.H), 256, bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH("prep_kernel");
}

template <typename T, int D>
void launch_prep_tc(const FwdParams& p, cudaStream_t stream) {
  constexpr int bytes = PrepTcSmem<T, D>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(prep_tc_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  // All of L1 as shared memory: 4 CTAs of 54 KB per SM at D = 64 need 226 KB of the 228.
  CUDA_CHECK(cudaFuncSetAttribute(prep_tc_kernel<T, D>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
  prep_tc_kernel<T, D><<<dim3(p.num_chunks, p.H), 128, bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH("prep_tc_kernel");
}

template void launch_prep_tc<__nv_bfloat16, 64>(const FwdParams&, cudaStream_t);
template void launch_prep_tc<__nv_bfloat16, 128>(const FwdParams&, cudaStream_t);
template void launch_prep_tc<__half, 64>(const FwdParams&, cudaStream_t);
template void launch_prep_tc<__half, 128>(const FwdParams&, cudaStream_t);
template void launch_prep<__nv_bfloat16, 64>(const FwdParams&, cudaStream_t);
template void launch_prep<__nv_bfloat16, 128>(const FwdParams&, cudaStream_t);
template void launch_prep<__half, 64>(const FwdParams&, cudaStream_t);
template void launch_prep<__half, 128>(const FwdParams&, cudaStream_t);

}  // namespace pathattn::cuda
