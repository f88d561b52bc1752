// The two-level carry of the backward (docs/math.md Eq. 47-50): chunks grouped into blocks, a pair of chunks in
// different blocks carried through one D x D product per block between them instead of one step per chunk. These
// are the block-level pieces: the block product, the query carried back to its block's start, and their backward
// into the chunks' factors. Row-major float32; chunk j's rows of the head's [L, D] arrays start at j * kChunk.
#pragma once

#include <cstdint>

#include "cpu/chunk.h"

namespace pathattn::cpu {

// Pi = P_{s+count-1} ... P_s (D x D; P_j = I - W_j^T U_j, Eq. 11) of the chunks f[0 .. count-1] = s .. s+count-1.
void block_product(const ChunkFactors* f, int64_t count, int64_t D, float* Pi);

// Backward of block_product: given dPi (D x D), accumulates each chunk's dW_j -= U_j dP_j^T and dU_j -= W_j dP_j
// (Eq. 34) with dP_j = (P_e ... P_{j+1})^T dPi (P_{j-1} ... P_s)^T, into dW and dU at the chunks' rows (first row
// of chunk f[0] at dW, dU).
void block_product_backward(const ChunkFactors* f, int64_t count, int64_t D, const float* dPi, float* dW, float* dU);

// Query rows Qhat [n, D] of a chunk carried back to the start of its block (Eq. 48): Qp = Qhat P_{m-1} ... P_s,
// through the chunks f[count-1], ..., f[0] = m-1, ..., s (count = 0: Qp = Qhat).
void carry_query_to_block_start(const ChunkFactors* f, int64_t count, const float* Qhat, int64_t n, int64_t D,
                                float* Qp);

// Backward of carry_query_to_block_start: given dQp, accumulates dQhat and the chunks' dW, dU (first row of chunk
// f[0] at dW, dU); recomputes the intermediate rows from Qhat.
void carry_query_to_block_start_backward(const ChunkFactors* f, int64_t count, const float* Qhat, const float* dQp,
                                         int64_t n, int64_t D, float* dQhat, float* dW, float* dU);

}  // namespace pathattn::cpu
