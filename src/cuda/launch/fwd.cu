// Launches the main forward kernel (kernels/fwd.cuh): one CTA of 128 threads per (query chunk, query head),
// flattened as block x = (h * NC + rank) * group + j for query head hq = h * group + j: consecutive CTAs are the
// query heads of one kv head on one chunk, then the next chunk of the schedule `order` (api.cu: a sequence's
// chunks from the last to the first), so resident CTAs share key chunks in L2 and the grid ends on short work.
//
// D = 64 runs the warpgroup (wgmma) kernel, kernels/fwd_wgmma.cuh; D = 128 the mma.sync kernel, kernels/fwd.cuh
// (its running query and output do not fit a warpgroup's registers next to a 64 x 128 tile yet).
#include "cuda/check.h"
#include "cuda/kernels/fwd.cuh"
#include "cuda/kernels/fwd_wgmma.cuh"
#include "cuda/launch/launch.h"
#include "cuda/tensor_maps.h"

namespace pathattn::cuda {

template <typename T, int D, bool kGate>
void launch_fwd(const FwdParams& p, cudaStream_t stream) {
  const int64_t blocks = static_cast<int64_t>(p.num_chunks) * p.HQ;
  if constexpr (D == 64) {
    const int64_t rows = static_cast<int64_t>(p.num_chunks) * p.H * kChunk;  // D = 64: E has C rows too
    const CUtensorMap tm_k = tensor_map_2d(p.ws.khat, rows, 64, 64, 64, 64, "the K^ workspace");
    const CUtensorMap tm_e = tensor_map_2d(p.ws.step, rows, 64, 64, 64, 64, "the E workspace");
    const CUtensorMap tm_v = tensor_map_bthd(p.v, p.B, p.T, p.H, 64, p.sv.b, p.sv.t, p.sv.h, 64, 64, "v");
    constexpr int wg_bytes = FwdWgSmem::kBytes;
    CUDA_CHECK(cudaFuncSetAttribute(fwd_wgmma_kernel<T, kGate>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_bytes));
    fwd_wgmma_kernel<T, kGate><<<static_cast<unsigned>(blocks), 128, wg_bytes, stream>>>(p, tm_k, tm_e, tm_v);
    CUDA_CHECK_LAUNCH("fwd_wgmma_kernel");
  } else {
    constexpr int bytes = FwdSmem<D>::kBytes;
    CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<T, D, kGate>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    fwd_kernel<T, D, kGate><<<static_cast<unsigned>(blocks), 128, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("fwd_kernel");
  }
}

#define PATHATTN_FWD(T, D)                                                \
  template void launch_fwd<T, D, false>(const FwdParams&, cudaStream_t); \
  template void launch_fwd<T, D, true>(const FwdParams&, cudaStream_t);
PATHATTN_FWD(__nv_bfloat16, 64)
PATHATTN_FWD(__nv_bfloat16, 128)
PATHATTN_FWD(__half, 64)
PATHATTN_FWD(__half, 128)
#undef PATHATTN_FWD

}  // namespace pathattn::cuda
