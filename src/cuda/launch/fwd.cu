// Launches the main forward kernel (kernels/fwd.cuh): one CTA of 128 threads per (query chunk, query head),
// flattened as block x = (h * NC + rank) * group + j for query head hq = h * group + j: consecutive CTAs are the
// query heads of one kv head on one chunk, then the next chunk of the schedule `order` (api.cu: a sequence's
// chunks from the last to the first), so resident CTAs share key chunks in L2 and the grid ends on short work.
#include "cuda/check.h"
#include "cuda/kernels/fwd.cuh"
#include "cuda/launch/launch.h"

namespace pathattn::cuda {

template <typename T, int D, bool kGate>
void launch_fwd(const Params& p, cudaStream_t stream) {
  constexpr int bytes = FwdSmem<D>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<T, D, kGate>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const int64_t blocks = static_cast<int64_t>(p.num_chunks) * p.HQ;
  fwd_kernel<T, D, kGate><<<static_cast<unsigned>(blocks), 128, bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH("fwd_kernel");
}

#define PATHATTN_FWD(T, D)                                                \
  template void launch_fwd<T, D, false>(const Params&, cudaStream_t); \
  template void launch_fwd<T, D, true>(const Params&, cudaStream_t);
PATHATTN_FWD(__nv_bfloat16, 64)
PATHATTN_FWD(__nv_bfloat16, 128)
PATHATTN_FWD(__half, 64)
PATHATTN_FWD(__half, 128)

}  // namespace pathattn::cuda
