// The plain structs the CUDA kernels see: pointers, strides (in elements) and sizes, nothing else.
// Built once per call on the host by api.cu over a Plan (plan.h) and a Workspace (workspace.h); dispatch.cu turns
// dtype / D / gate into template arguments. The forward's FwdParams is a prefix of the backward's BwdParams, so the
// stages they share (gate cumulation, the UT preprocess) take a FwdParams and run unchanged inside the backward.
#pragma once

#include <cstdint>

namespace pathattn::cuda {

constexpr int kChunk = 64;  // C: tokens per chunk, rows of one UT factor (docs/math.md Eq. 10)
constexpr int kLocalTiles = 11;  // f32 [C, D] scratch tiles per chunk-local backward CTA (kernels/bwd_local.cuh)

// One chunk of one sequence. Chunks restart at each sequence start (varlen), so only a sequence's
// last chunk can be shorter than kChunk.
struct ChunkInfo {
  int b;       // batch row
  int t0;      // first row of the chunk in the T dimension
  int len;     // 1..kChunk
  int first;   // global index of the first chunk of this chunk's sequence
  int last;    // global index of the last chunk of this chunk's sequence
};

// One sequence: its chunks are [first, first + count) in the global chunk numbering.
struct SeqInfo {
  int first;
  int count;
};

// Strides of a [B, T, X, ...] tensor (elements): batch, time, head. The last dimension is contiguous (checked by
// supports()); for [B, T, X] tensors (beta, g, lse) `h` is the stride of X.
struct Strides {
  int64_t b, t, h;
};

// Per-(chunk, kv head) products of the UT preprocess (Eq. 10-14, 32), in the tensor-core dtype, rows padded to
// kChunk with zeros past the chunk's length. Index: ((chunk * H + h) * kChunk + row) * D + col. The forward and
// the backward both build them (the backward recomputes them instead of keeping the forward's).
struct ChunkFactors {
  void* khat;     // [NC, H, C, D]  K^ (Eq. 14), keys carried to the chunk end
  void* u;        // [NC, H, C, D]  U = T b W (Eq. 10)
  void* w;        // [NC, H, C, D]  W in the tensor-core dtype
  void* m;        // [NC, H, C, C]  T b strict_lower(W K^T) (Eq. 12)
  void* step;     // [NC, H, D, D]  E = -U^T W: the query's step across the chunk, Q~ <- Q~ + Q~ E^T (Eq. 32)
  float* khat32;  // [NC, H, C, D]  f32 copies for the key cache (kcache only, else null)
  float* u32;     // [NC, H, C, D]
  float* w32;     // [NC, H, C, D]
  float* gl;      // [NC, HQ, C]    gate cumulated inside the chunk (gate only)
  double* goff;   // [NC, HQ]       gate cumulated over the sequence's earlier chunks (docs/spec.md §6)
  double* gtot;   // [NC, HQ]       each chunk's gate total
};

struct FwdParams {
  // Inputs (device pointers).
  const void* q;       // [B, T, HQ, D]   bf16 / f16
  const void* k;       // [B, T, H, D]
  const void* v;       // [B, T, H, D]    (DV == D)
  const void* w;       // [B, T, H, D]    f32 or bf16 (w_is_bf16)
  const float* beta;   // [B, T, H]
  const float* g;      // [B, T, HQ] or null
  Strides sq, sk, sv, sw, so, skc;
  Strides sbeta, sg, slse;
  bool w_is_bf16;
  // Outputs (the forward's; the backward reads o and lse through these).
  void* o;             // [B, T, HQ, D]
  float* lse;          // [B, T, HQ]
  void* kcache;        // [B, T, H, D] or null
  // Sizes.
  int B, T, H, HQ, group;
  int num_chunks;      // NC
  int num_seqs;
  float scale_log2;    // scale * log2(e): logits in base 2 (exp2 in the softmax)
  const ChunkInfo* chunks;  // [NC]
  const SeqInfo* seqs;      // [num_seqs]
  const int* order;         // [NC] query chunks in the forward's schedule order (plan.cu)
  ChunkFactors ws;
  // The two-level carry (docs/math.md section 8): a sequence's chunks in blocks of carry_block, the first block
  // starting at its first chunk; 0 = off (the fields below are unused). The forward (Eq. 51-53; env
  // PATHATTN_FWD_BLOCK): a query meets the keys of its own block through K^ and a step E per chunk, and the keys of an
  // earlier block through kfar, the keys carried to their block's end, with one step per block (blockstep). The
  // backward (Eq. 54-57; env PATHATTN_BWD_BLOCK) uses the same tables and blockstep with its own block size, and
  // its fields in BwdParams.
  int carry_block;          // chunks per block, 0 = off
  int num_blocks;           // blocks over all sequences
  const int* blk_of;        // [NC] the global block index of each chunk (carry_block > 0)
  const int* blk_start;     // [num_blocks] each block's first chunk
  void* kfar;               // [NC, H, C, D]  K'_c: K^_c carried to the end of its block (Eq. 52; forward only)
  void* blockstep;          // [num_blocks, H, D, D]  F_b = Pi_b^T - I: the step across a whole block (Eq. 53)
};

// The backward (docs/math.md Eq. 19-23 on the GPU, docs/cuda.md "Backward"): the forward's view of the inputs
// plus the output gradient, the gradients, and the backward's own buffers.
struct BwdParams : FwdParams {
  const void* dout;     // [B, T, HQ, D]  like q
  const float* dlse;    // [B, T, HQ] or null
  Strides sdo, sdlse;
  // Gradients (outputs).
  void* dq;             // [B, T, HQ, D]  like q
  void* dk;             // [B, T, H, D]   like k
  void* dv;             // [B, T, H, D]   like v
  void* dw;             // [B, T, H, D]   like w (f32 or bf16: w_is_bf16)
  float* dbeta;         // [B, T, H]
  float* dg;            // [B, T, HQ] or null
  Strides sdq, sdk, sdv, sdw, sdbeta, sdg;
  float scale;          // the softmax scale (ds = scale dl, Eq. 6)
  // Per query chunk and query head (bwd_prep): the query carried to its chunk start, and the softmax statistics
  // the main kernel needs in base 2; padded rows hold Q^ = 0, lse2 = +inf (probability 0), delta = 0.
  void* qhat;           // [NC, HQ, C, D]  Q^ (Eq. 13), tensor-core dtype
  float* lse2;          // [NC, HQ, C]     lse * log2(e)
  float* delta;         // [NC, HQ, C]     dO . o - dlse (Eq. 6)
  void* dohat;          // [NC, HQ, C, D]  dO in chunk tiles, zero past a chunk's end (the wgmma main kernel's TMA
                        //                 source; null when the mma.sync main kernel runs)
  // Accumulators, f32, written by the main kernel and finished by the chunk-local kernel.
  float* dqacc;         // [NC, HQ, C, D]  dQ^ from every earlier key chunk (Eq. 21), then dq in place
  float* dkacc;         // [NC, H, C, D]   dK^ (Eq. 23), then dk in place
  float* dvacc;         // [NC, H, C, D]   dV (Eq. 5)
  float* dpacc;         // [NC, H, D, D]   d loss / d P_j of the chunk's product P_j = I - W^T U (Eq. 22, D x D form)
  float* dgacc;         // [NC, HQ, C]     dG_t (Eq. 7, gate only): minus the column sums of dl, then dG
  float* dgrow;         // [NC, HQ, C]     the row sums of dl over earlier key chunks (gate only)
  // Ordering of the cross-block sums (deterministic mode): how many key chunks have added to a chunk's dQ^ / dP.
  int* count_q;         // [NC, HQ]
  int* count_p;         // [NC, H]
  int* next_task;       // [1]  the main kernel's task counter (tasks are taken in list order)
  const int* tasks;     // [num_tasks] (chunk * H + h), key chunks in an order where every task's predecessor
                        // in the summation order comes earlier (plan.cu)
  int num_tasks;
  // The two-level backward (carry_block > 0; docs/math.md Eq. 54-57, cuda/bwd_blocks.h; else null): the block
  // preprocess's prefix products and carried queries, and the far pairs' sums, which the block gradient sweep turns
  // into dP and dQ^ (kernels/bwd_block_sweep.cuh).
  void* sprefix;        // [NC, H, D, D]   X_m = S_m^T, S_m = P_{m-1} .. P_{s_b} (I at a block's first chunk)
  void* qfar;           // [NC, HQ, C, D]  Q'_m = Q^_m S_m: the query carried back to its block's start (Eq. 48)
  float* dqfar;         // [NC, HQ, C, D]  d loss / d Q'_m from the far pairs (f32, zeroed)
  float* dpiacc;        // [num_blocks, H, D, D]  d loss / d Pi_b (Eq. 50; f32, zeroed)
  int* count_pi;        // [num_blocks, H]  dPi_b's turns (deterministic mode)
  // Per resident main-kernel CTA: the key chunk carried to every later chunk start, K~_{c,m} (Eq. 18); with blocks,
  // to every level's start (cuda/bwd_blocks.h).
  void* slots;          // [num_slots, slot_chunks, C, D] (plan.h bwd_slot_chunks)
  int slot_chunks;      // carried copies per task (the slot's capacity in C x D tiles: plan.h bwd_slot_chunks)
  // Per resident chunk-local CTA: f32 scratch tiles (kernels/bwd_local.cuh).
  float* local_scratch; // [num_local_slots, kLocalTiles, C, D]
  bool deterministic;
  // The fence before a deterministic turn is passed (the wgmma main kernels; bwd_tiles.cuh TurnFence): false,
  // fence.sc.gpu (__threadfence, measured); true, fence.acq_rel.gpu (env PATHATTN_BWD_FENCE=acq_rel, api.cu; unrun).
  bool turn_fence_acq_rel;
  // Passes a warp of those kernels may hold before it fences (bwd_main_pair.cuh defer_pass): 2 (measured), up to
  // bwd_detail::kMaxHeld (4) by env PATHATTN_BWD_HELD (api.cu; 3 measured level with 2, 4 unrun).
  int held_passes;
  // q's and dout's rows are 16-byte aligned (api.cu; the API asks 4 bytes): bwd_local at D = 64 then copies them
  // into shared memory by cp.async (bwd_local.cuh v26), else it stages them through registers.
  bool local_qdo_async;
  // Timing experiments only (wrong gradients; env PATHATTN_BWD_TIMING_SKIP, api.cu): bits that make the wgmma main
  // kernel leave a stage out, so that its cost is the time difference (docs/perf/notes.md). 1: the dQ^ atomics,
  // 2: the dP atomics, 4: phase 1's products, 8: the dQ^ product and its atomics; and the chunk-local kernel:
  // 16: the UT solve, 32: the per-head part, 64: the key side (Eq. 29-30), 128: dP and K^'s backward (Eq. 34, 29),
  // 256: the factors' recomputation (Eq. 10, 12); the wgmma main kernels' deterministic turns (the sums stay right,
  // their order not fixed): 512: no fence before a turn is passed, 1024: no wait for a turn (both wgmma
  // main kernels). 0 in every real call.
  int timing_skip;
};

}  // namespace pathattn::cuda
