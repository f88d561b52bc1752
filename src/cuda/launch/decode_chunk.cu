// The chunked decode's launches (kernels/decode_chunk.cuh): per chunk of up to 64 tokens the prep, split and combine
// kernels, in order on the caller's stream. Apart from launch/decode.cu so that the two compile in parallel.
#include <algorithm>

#include "common/env.h"
#include "cuda/check.h"
#include "cuda/kernels/decode_chunk.cuh"
#include "cuda/launch/decode_launch.h"

namespace pathattn::cuda {

bool decode_uses_chunks(bool checkpointed, int64_t S) {
  // Calls of at least PATHATTN_DECODE_CHUNK tokens (default 4; 0: never; 1 or 2: every call of several tokens). On
  // the H100 (twenty-second session, H 8, HQ 32, f32 cache; docs/perf/results.md "Chunked decode") a chunk against
  // S single steps: S = 4 0.94-1.38x the speed (B 1, D 64, 16k: 7% slower), S = 16 2.5-3.2x, S = 64 3.2-4.1x.
  static const int64_t min_tokens = env::integer("PATHATTN_DECODE_CHUNK", 4, 0);
  return min_tokens > 0 && !checkpointed && S >= std::max<int64_t>(min_tokens, 2);
}

namespace {

template <typename T, int D, typename KC, typename VC>
void launch_chunks(const DecodeParams& p, int S, cudaStream_t stream) {
  constexpr int kPrepSmem = decode_chunk_prep_smem_bytes<D>(), kSplitSmem = decode_chunk_split_smem_bytes<D>();
  // Once per instance, on the first (eager) call: a CUDA-graph capture of a later step must not meet it.
  static const bool sized = [] {
    CUDA_CHECK(cudaFuncSetAttribute(decode_chunk_prep_kernel<T, D, KC, VC>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPrepSmem));
    for (auto* f : {decode_chunk_split_kernel<T, D, KC, VC, 1>, decode_chunk_split_kernel<T, D, KC, VC, 2>,
                    decode_chunk_split_kernel<T, D, KC, VC, 4>})
      CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSplitSmem));
    return true;
  }();
  (void)sized;
  DecodeParams prm = p;
  prm.S = S;
  const unsigned pairs = static_cast<unsigned>(static_cast<int64_t>(p.B) * p.H);
  const unsigned split_blocks = static_cast<unsigned>(static_cast<int64_t>(p.B) * p.H * p.num_splits);
  const unsigned heads = static_cast<unsigned>(static_cast<int64_t>(p.B) * p.HQ);
  for (int t0 = 0; t0 < S; t0 += kChunk) {
    prm.step = t0;
    prm.chunk_n = std::min(kChunk, S - t0);
    decode_chunk_prep_kernel<T, D, KC, VC><<<pairs, kDecodeChunkThreads, kPrepSmem, stream>>>(prm);
    CUDA_CHECK_LAUNCH("decode_chunk_prep_kernel");
    const int groups = decode_chunk_row_groups(prm.chunk_n, p.group);
    auto split = groups == 1   ? decode_chunk_split_kernel<T, D, KC, VC, 1>
                 : groups == 2 ? decode_chunk_split_kernel<T, D, KC, VC, 2>
                               : decode_chunk_split_kernel<T, D, KC, VC, 4>;
    split<<<split_blocks, kDecodeChunkThreads, kSplitSmem, stream>>>(prm);
    CUDA_CHECK_LAUNCH("decode_chunk_split_kernel");
    decode_chunk_combine_kernel<T, D><<<dim3(heads, prm.chunk_n), kCombineThreads, 0, stream>>>(prm);
    CUDA_CHECK_LAUNCH("decode_chunk_combine_kernel");
  }
}

}  // namespace

template <typename T, int D>
void launch_decode_chunks(const DecodeParams& p, int S, cudaStream_t stream) {
  if (p.ck_bf16)
    p.cv_low ? launch_chunks<T, D, __nv_bfloat16, T>(p, S, stream)
             : launch_chunks<T, D, __nv_bfloat16, float>(p, S, stream);
  else
    p.cv_low ? launch_chunks<T, D, float, T>(p, S, stream) : launch_chunks<T, D, float, float>(p, S, stream);
}

template void launch_decode_chunks<__nv_bfloat16, 64>(const DecodeParams&, int, cudaStream_t);
template void launch_decode_chunks<__nv_bfloat16, 128>(const DecodeParams&, int, cudaStream_t);
template void launch_decode_chunks<__half, 64>(const DecodeParams&, int, cudaStream_t);
template void launch_decode_chunks<__half, 128>(const DecodeParams&, int, cudaStream_t);

}  // namespace pathattn::cuda
