// The decode launch sequence (kernels/decode.cuh, kernels/decode_checkpoint.cuh) for one instance, included by
// launch/decode.cu (the plain cache) and launch/decode_ckpt.cu (the checkpointed one), two files that compile in
// parallel.
#pragma once

#include <type_traits>

#include "common/env.h"
#include "cuda/check.h"
#include "cuda/kernels/decode.cuh"
#include "cuda/kernels/decode_checkpoint.cuh"
#include "cuda/kernels/decode_mma.cuh"
#include "cuda/kernels/decode_refresh_mma.cuh"
#include "cuda/launch/decode_launch.h"

namespace pathattn::cuda {

// Environment switches of the split kernel (common/env.h: 0 or 1, unset for the default), read once.
// The prefetching instances for the plain cache (kernels/decode.cuh, kPrefetch): on by default since they ran on
// the H200 (eleventh session: 2-11% faster at B = 64, f32 cache 81-83% -> 82-90% of the copy bandwidth, bf16
// 43-48% -> 45-50%; docs/perf/results.md); PATHATTN_DECODE_PREFETCH=0 selects the plain instances.
inline bool decode_prefetch() {
  static const bool on = env::flag("PATHATTN_DECODE_PREFETCH", true);
  return on;
}
// The tensor-core split kernel for bf16 inputs with bf16 keys and values, plain or checkpointed cache
// (kernels/decode_mma.cuh): the default for them since the twelfth session, where on the H200 it took a bf16
// cache's step from 37-50% to 58-88% of the copy bandwidth at B >= 8, L >= 16k (1.5-1.9x faster; checkpointed,
// 1.6-3.2x), memcheck and racecheck clean (docs/perf/results.md). PATHATTN_DECODE_MMA=0 selects the team kernel.
inline bool decode_mma() {
  static const bool on = env::flag("PATHATTN_DECODE_MMA", true);
  return on;
}
// The combine kernel as a programmatic dependent of the split kernel (kernels/common.cuh pdl_wait): its launch and
// its blocks' start overlap the split kernel's last blocks, which at B = 1 (one wave of splits, a step of 16-40 us)
// is a few microseconds a step. Opt-in, PATHATTN_DECODE_PDL=1, until it has run on the GPU (thirteenth session).
inline bool decode_pdl() {
  static const bool on = env::flag("PATHATTN_DECODE_PDL", false);
  return on;
}
// `kernel`<<<blocks, threads, 0, stream>>>(prm), allowed to start before the previous kernel on the stream ends (the
// kernel must pdl_wait before it touches what that kernel writes or reads).
inline void launch_programmatic(void (*kernel)(const DecodeParams), unsigned blocks, unsigned threads,
                                cudaStream_t stream, const DecodeParams& prm) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, prm));
}
// 16-byte row loads of a 16-bit cache tensor: its pointer and strides (elements) keep every row 16-byte aligned.
inline bool rows_16b_aligned(const void* ptr, const Strides& s) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s.b % 8 == 0 && s.t % 8 == 0 && s.h % 8 == 0;
}
inline bool decode_mma_fits(const DecodeParams& p) {
  return p.ck_bf16 && p.cv_low && rows_16b_aligned(p.ck, p.sck) && rows_16b_aligned(p.cv, p.scv);
}
// Whether the split kernel is the tensor-core one for these inputs (bf16 inputs only): the launch below and the
// plan's resident-block count (decode.cu decode_split_blocks_per_sm) ask the same question here.
inline bool decode_split_is_mma(const DecodeParams& p, bool bf16_inputs) {
  return bf16_inputs && decode_mma() && decode_mma_fits(p);
}
// The checkpointed cache's refresh on tensor cores for bf16 keys (kernels/decode_refresh_mma.cuh): the default
// since it ran on the GPU (thirteenth session: 34/34 decode tests, sanitizers clean, the bf16 checkpointed step's
// mean at D 128, B 64, 16k 1979 -> 1515 us). PATHATTN_DECODE_REFRESH_MMA=0 selects the CUDA-core refresh.
inline bool decode_refresh_mma() {
  static const bool on = env::flag("PATHATTN_DECODE_REFRESH_MMA", true);
  return on;
}

// The split kernel's instance for the cache's key and value types (f32 / bf16 keys, f32 / T values).
template <typename T, int D, int kG, bool kCkpt, bool kPrefetch>
auto split_kernel_for(const DecodeParams& p) {
  return p.ck_bf16 ? (p.cv_low ? decode_split_kernel<T, D, kG, __nv_bfloat16, T, kCkpt, kPrefetch>
                               : decode_split_kernel<T, D, kG, __nv_bfloat16, float, kCkpt, kPrefetch>)
                   : (p.cv_low ? decode_split_kernel<T, D, kG, float, T, kCkpt, kPrefetch>
                               : decode_split_kernel<T, D, kG, float, float, kCkpt, kPrefetch>);
}

// Per new token, in order on `stream`: [the carry kernel], the split kernel, the combine kernel, [the refresh kernel]
// (brackets: the checkpointed cache only).
template <typename T, int D, int kG, bool kCkpt>
void launch_decode_steps(const DecodeParams& p, int S, cudaStream_t stream) {
  if constexpr (!kCkpt)
    if (p.chunk_rows > 0) return launch_decode_chunks<T, D>(p, S, stream);  // api.cu chose chunks, sized for them
  DecodeParams prm = p;
  prm.S = S;
  const unsigned split_blocks = static_cast<unsigned>(static_cast<int64_t>(p.B) * p.H * p.num_splits);
  const unsigned combine_blocks = static_cast<unsigned>(static_cast<int64_t>(p.B) * p.HQ);
  const unsigned carry_blocks = static_cast<unsigned>(static_cast<int64_t>(p.B) * p.H);
  void (*split)(const DecodeParams) = split_kernel_for<T, D, kG, kCkpt, false>(p);
  if constexpr (!kCkpt)
    if (decode_prefetch()) split = split_kernel_for<T, D, kG, false, true>(p);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    if (decode_split_is_mma(p, true)) split = decode_split_mma_kernel<D, kCkpt>;
  void (*refresh)(const DecodeParams) = nullptr;
  int refresh_smem = 0;
  if constexpr (kCkpt) {
    refresh = p.ck_bf16 ? decode_refresh_kernel<__nv_bfloat16, D> : decode_refresh_kernel<float, D>;
    refresh_smem = decode_refresh_smem_bytes<D>();
    if (p.ck_bf16 && decode_refresh_mma() && rows_16b_aligned(p.ck, p.sck)) {
      refresh = decode_refresh_mma_kernel<D>;
      refresh_smem = decode_refresh_mma_smem_bytes<D>();
    }
    // Once per instance, on the first (eager) call: a CUDA-graph capture of a later step must not meet it.
    static const bool sized = [] {
      constexpr int kSmem = decode_refresh_smem_bytes<D>(), kSmemMma = decode_refresh_mma_smem_bytes<D>();
      for (auto* f : {decode_refresh_kernel<__nv_bfloat16, D>, decode_refresh_kernel<float, D>})
        CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      CUDA_CHECK(
          cudaFuncSetAttribute(decode_refresh_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemMma));
      return true;
    }();
    (void)sized;
  }
  for (int s = 0; s < S; ++s) {
    prm.step = s;
    if constexpr (kCkpt) {
      decode_carry_kernel<T, D><<<carry_blocks, kCarryThreads, 0, stream>>>(prm);
      CUDA_CHECK_LAUNCH("decode_carry_kernel");
    }
    split<<<split_blocks, kDecodeThreads, 0, stream>>>(prm);
    CUDA_CHECK_LAUNCH("decode_split_kernel");
    if (decode_pdl())
      launch_programmatic(decode_combine_kernel<T, D>, combine_blocks, kCombineThreads, stream, prm);
    else
      decode_combine_kernel<T, D><<<combine_blocks, kCombineThreads, 0, stream>>>(prm);
    CUDA_CHECK_LAUNCH("decode_combine_kernel");
    if constexpr (kCkpt) {
      refresh<<<split_blocks, kCarryThreads, refresh_smem, stream>>>(prm);
      CUDA_CHECK_LAUNCH("decode_refresh_kernel");
    }
  }
}

#define PATHATTN_DECODE_STEP_INSTANCES(T, D, CK)                                                   \
  template void launch_decode_steps<T, D, 1, CK>(const DecodeParams&, int, cudaStream_t);          \
  template void launch_decode_steps<T, D, 2, CK>(const DecodeParams&, int, cudaStream_t);          \
  template void launch_decode_steps<T, D, 4, CK>(const DecodeParams&, int, cudaStream_t);          \
  template void launch_decode_steps<T, D, 8, CK>(const DecodeParams&, int, cudaStream_t);

}  // namespace pathattn::cuda
