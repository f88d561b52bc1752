// Launches the main forward kernel (kernels/fwd.cuh): one CTA of 128 threads per (query chunk, query head),
// flattened as block x = (h * NC + rank) * group + j for query head hq = h * group + j: consecutive CTAs are the
// query heads of one kv head on one chunk, then the next chunk of the schedule `order` (api.cu: a sequence's
// chunks from the last to the first), so resident CTAs share key chunks in L2 and the grid ends on short work.
//
// D = 64 and D = 128 run the warpgroup (wgmma) kernel, kernels/fwd_wgmma.cuh. At D = 128 its kOneE instances (one E
// slot, 106 KB, two CTAs per SM) are the default: measured 16-19% faster than the two-E-slot ones (152 KB, one CTA
// per SM) on the H200, which were 1.4-2.1x faster than the mma.sync kernel (docs/perf/results.md, "fourteenth
// session" and "Forward at D = 128 on wgmma"). For the A/B of tools/gpu_check.sh fwd128, PATHATTN_FWD128=twoe
// selects the two-E-slot instances and PATHATTN_FWD128=mma the mma.sync kernel, kernels/fwd.cuh.
#include <string>
#include <type_traits>

#include "common/env.h"
#include "cuda/check.h"
#include "cuda/kernels/fwd.cuh"
#include "cuda/kernels/fwd_block_carry.cuh"
#include "cuda/kernels/fwd_wgmma.cuh"
#include "cuda/launch/launch.h"
#include "cuda/tensor_maps.h"

namespace pathattn::cuda {

// The D = 128 kernel PATHATTN_FWD128 names: "onee" (unset: the default, one E slot), "twoe" or "mma".
bool fwd128_is(const char* name) {
  static const std::string chosen = env::choice("PATHATTN_FWD128", {"onee", "twoe", "mma"}, "onee");
  return chosen == name;
}

// The two-level forward's block preprocess (kernels/fwd_block_carry.cuh): K' and the block steps F, after the UT
// preprocess and before the main kernel (dispatch.cu, p.carry_block > 0).
// Its forms: "sweep" (the default: one CTA per block and kv head, each E read once), "split" (the same with one CTA
// per 64 rows of X: D / 64 CTAs per block; at D = 64 the sweep itself) and "items" (one CTA per chunk's K' and per 64
// rows of a block's F: more parallel, more products); env PATHATTN_FWD_BLOCK_CARRY.
template <typename T, int D>
void launch_fwd_block_carry(const FwdParams& p, cudaStream_t stream) {
  static const std::string form = env::choice("PATHATTN_FWD_BLOCK_CARRY", {"sweep", "split", "items"}, "sweep");
  if (form == "items") {
    const int64_t items = static_cast<int64_t>(p.num_chunks) + static_cast<int64_t>(p.num_blocks) * (D / 64);
    constexpr int bytes = BlockCarrySmem<D>::kBytes;
    auto kernel = fwd_block_carry_kernel<T, D>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    kernel<<<dim3(static_cast<unsigned>(items), static_cast<unsigned>(p.H)), 128, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("fwd_block_carry_kernel");
  } else {
    const auto run = [&](auto tiles_c) {
      constexpr int kTiles = decltype(tiles_c)::value;
      constexpr int bytes = BlockSweepSmem<D, kTiles>::kBytes;
      auto kernel = fwd_block_sweep_kernel<T, D, kTiles>;
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      const dim3 grid(static_cast<unsigned>(p.num_blocks), static_cast<unsigned>(p.H), D / 64 / kTiles);
      kernel<<<grid, 128 * kTiles, bytes, stream>>>(p);
      CUDA_CHECK_LAUNCH("fwd_block_sweep_kernel");
    };
    if (form == "split")
      run(std::integral_constant<int, 1>{});
    else
      run(std::integral_constant<int, D / 64>{});
  }
}

template <typename T, int D, bool kGate, bool kOneE = false>
void launch_fwd_wgmma(const FwdParams& p, cudaStream_t stream) {
  const int64_t blocks = static_cast<int64_t>(p.num_chunks) * p.HQ;
  // 64 x 64 boxes: K^ and K' [NC H C, D], E [NC H D, D] (D = 64: E has C rows too), F [NB H D, D], v [B, T, H, D].
  const int64_t krows = static_cast<int64_t>(p.num_chunks) * p.H * kChunk, erows = krows / kChunk * D;
  const CUtensorMap tm_k = tensor_map_2d(p.ws.khat, krows, D, D, 64, 64, "the K^ workspace");
  const CUtensorMap tm_e = tensor_map_2d(p.ws.step, erows, D, D, 64, 64, "the E workspace");
  const CUtensorMap tm_v = tensor_map_bthd(p.v, p.B, p.T, p.H, D, p.sv.b, p.sv.t, p.sv.h, 64, 64, "v");
  // Without blocks the far maps repeat K^ and E (never read: every chunk is near).
  const bool blocks_on = p.carry_block > 0;
  const int64_t frows = static_cast<int64_t>(p.num_blocks) * p.H * D;
  const CUtensorMap tm_kf = far_map(blocks_on, p.kfar, krows, D, tm_k, "the K' workspace");
  const CUtensorMap tm_f = far_map(blocks_on, p.blockstep, frows, D, tm_e, "the block step workspace");
  constexpr int wg_bytes = FwdWgSmem<D, kOneE>::kBytes;
  auto kernel = fwd_wgmma_kernel<T, D, kGate, kOneE>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_bytes));
  kernel<<<static_cast<unsigned>(blocks), 128, wg_bytes, stream>>>(p, tm_k, tm_e, tm_v, tm_kf, tm_f);
  CUDA_CHECK_LAUNCH(kOneE ? "fwd_wgmma_kernel (one E slot)" : "fwd_wgmma_kernel");
}

template <typename T, int D, bool kGate>
void launch_fwd(const FwdParams& p, cudaStream_t stream) {
  if constexpr (D == 64) {
    launch_fwd_wgmma<T, D, kGate>(p, stream);
  } else if (fwd128_is("twoe")) {
    launch_fwd_wgmma<T, D, kGate, false>(p, stream);
  } else if (!fwd128_is("mma")) {
    launch_fwd_wgmma<T, D, kGate, true>(p, stream);
  } else {
    const int64_t blocks = static_cast<int64_t>(p.num_chunks) * p.HQ;
    constexpr int bytes = FwdSmem<D>::kBytes;
    CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<T, D, kGate>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    fwd_kernel<T, D, kGate><<<static_cast<unsigned>(blocks), 128, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("fwd_kernel");
  }
}

#define PATHATTN_FWD(T, D)                                                \
  template void launch_fwd<T, D, false>(const FwdParams&, cudaStream_t); \
  template void launch_fwd<T, D, true>(const FwdParams&, cudaStream_t);  \
  template void launch_fwd_block_carry<T, D>(const FwdParams&, cudaStream_t);
PATHATTN_FWD(__nv_bfloat16, 64)
PATHATTN_FWD(__nv_bfloat16, 128)
PATHATTN_FWD(__half, 64)
PATHATTN_FWD(__half, 128)
#undef PATHATTN_FWD

}  // namespace pathattn::cuda
