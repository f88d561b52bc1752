// Launches the backward's own kernels (kernels/bwd_prep.cuh, bwd_main.cuh, bwd_local.cuh) and sizes their
// persistent grids: as many CTAs as fit on the device at once, since the main kernel's CTAs wait for each other
// (all must be resident) and each owns a scratch slot. Included by bwd_<dtype>_<D>.cu, one instance list each, so
// that the four (dtype, D) builds of these large kernels compile in parallel.
#pragma once

#include "cuda/check.h"
#include "cuda/kernels/bwd_local.cuh"
#include "cuda/kernels/bwd_main.cuh"
#include "cuda/kernels/bwd_prep.cuh"
#include "cuda/launch/launch.h"

namespace pathattn::cuda {
namespace bwd_launch_detail {

inline int sm_count() {
  int dev = 0, n = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

template <typename K>
inline int resident(K kernel, int threads, int bytes, const char* name) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes));
  if (per_sm < 1) throw RuntimeError(std::string("pathattn: ") + name + " does not fit on this device");
  return per_sm * sm_count();
}

}  // namespace bwd_launch_detail

template <typename T, int D, bool kGate, bool kDet>
BwdGrid bwd_grid(int group) {
  BwdGrid g;
  g.main_ctas = bwd_launch_detail::resident(bwd_main_kernel<T, D, kGate, kDet>, 128, BwdMainSmem<D>::bytes(group, kGate), "bwd_main_kernel");
  g.local_ctas = bwd_launch_detail::resident(bwd_local_kernel<T, D, kGate>, 256, bwd_local_smem_bytes<D>(), "bwd_local_kernel");
  return g;
}

template <typename T, int D, bool kGate, bool kDet>
void launch_bwd(const BwdParams& p, const BwdGrid& grid, cudaStream_t stream, const StageMark& mark) {
  {
    constexpr int bytes = BwdPrepSmem<D>::kBytes;
    CUDA_CHECK(cudaFuncSetAttribute(bwd_prep_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    bwd_prep_kernel<T, D><<<dim3(p.num_chunks, p.HQ), 128, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("bwd_prep_kernel");
  }
  mark("bwd_prep");
  {
    const int bytes = BwdMainSmem<D>::bytes(p.group, kGate);
    CUDA_CHECK(cudaFuncSetAttribute(bwd_main_kernel<T, D, kGate, kDet>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    bwd_main_kernel<T, D, kGate, kDet><<<grid.main_ctas, 128, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("bwd_main_kernel");
  }
  mark("bwd_main");
  {
    constexpr int bytes = bwd_local_smem_bytes<D>();
    CUDA_CHECK(cudaFuncSetAttribute(bwd_local_kernel<T, D, kGate>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    bwd_local_kernel<T, D, kGate><<<grid.local_ctas, 256, bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("bwd_local_kernel");
  }
  mark("bwd_local");
  if constexpr (kGate) launch_bwd_gate(p, stream);
  mark("bwd_gate");
}

#define PATHATTN_BWD(T, D, G, DET)                             \
  template BwdGrid bwd_grid<T, D, G, DET>(int);                \
  template void launch_bwd<T, D, G, DET>(const BwdParams&, const BwdGrid&, cudaStream_t, const StageMark&);
#define PATHATTN_BWD_ALL(T, D)      \
  PATHATTN_BWD(T, D, false, false)  \
  PATHATTN_BWD(T, D, false, true)   \
  PATHATTN_BWD(T, D, true, false)   \
  PATHATTN_BWD(T, D, true, true)

}  // namespace pathattn::cuda
