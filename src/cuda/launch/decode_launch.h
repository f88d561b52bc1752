// The decode launcher (kernels/decode.cuh), apart from launch.h so that the decode's files build on their own.
// dispatch.cu picks the instance.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/decode_params.h"

namespace pathattn::cuda {

// S decoding steps, one launch pair (split kernel, combine kernel; with a checkpointed cache also the carry and
// refresh kernels) per new token, in order on `stream`: token s
// attends to the cache that token s - 1 left (the S rank-one carries of Eq. 3 instead of the CPU's one UT factor
// per 64 tokens: equal to rounding). kG: query heads per pass of the split kernel (1, 2, 4 or 8).
template <typename T, int D, int kG>
void launch_decode(const DecodeParams& p, int S, cudaStream_t stream);
// Split blocks of the kernel launch_decode will pick that fit on one SM at once: 1 for the tensor-core kernel at
// D = 128 (bf16 inputs, bf16 keys and values, 16-byte rows; 255 registers), else 2. Reads p's cache fields only.
int decode_split_blocks_per_sm(const DecodeParams& p, bool bf16_inputs, int D);
// Whether a call of S tokens runs as chunks of up to 64 (kernels/decode_chunk.cuh: each cached row read and carried
// once per chunk) instead of S single steps: the plain cache, S >= PATHATTN_DECODE_CHUNK (default 4; 0 never;
// launch/decode_chunk.cu).
bool decode_uses_chunks(bool checkpointed, int64_t S);
// The chunked launch sequence; p's workspace has the chunk fields (decode_params.h) for min(S, 64) tokens.
template <typename T, int D>
void launch_decode_chunks(const DecodeParams& p, int S, cudaStream_t stream);
// One cache layout's launch sequence (kCkpt: the checkpointed cache, p.ckpt set): launch/decode_impl.cuh.
template <typename T, int D, int kG, bool kCkpt>
void launch_decode_steps(const DecodeParams& p, int S, cudaStream_t stream);

}  // namespace pathattn::cuda
