// The call's plan on the host: chunk and sequence tables, and the schedule of each kernel family. Built once per
// call from the sequences (a batch row each, or cu_seqlens' segments), uploaded into the workspace.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "common/problem.h"
#include "cuda/decode_params.h"
#include "cuda/params.h"

namespace pathattn::cuda {

struct Plan {
  std::vector<ChunkInfo> chunks;  // [NC] chunks restart at each sequence start
  std::vector<SeqInfo> seqs;      // [num_seqs]
  int max_chunks = 0;             // of one sequence
  // Forward main kernel: query chunks, sequences longest first, a sequence's chunks from its last to its first.
  std::vector<int> fwd_order;     // [NC] (forward plans only)
  // Backward main kernel: key-chunk tasks (chunk * H + h; with key blocks, the block's first chunk) in the order CTAs
  // take them.
  std::vector<int> bwd_tasks;     // [NC * H] (backward plans only)
  // The two-level carry (add_carry_blocks; FwdParams::carry_block), forward or backward: each sequence's chunks in
  // blocks of carry_block, the first starting at its first chunk; the global block index of every chunk and every
  // block's first chunk.
  int carry_block = 0;
  std::vector<int> blk_of;        // [NC]
  std::vector<int> blk_start;     // [num_blocks]
};

// cu_seqlens' N + 1 values copied to the host on `stream` (which it synchronises), contiguous.
std::vector<int32_t> cu_seqlens_to_host(const TensorView& cu, cudaStream_t stream);
// Sequences as (b, t0, len): from the problem, or from cu_seqlens read back from the device (on `stream`).
std::vector<Segment> sequences(const Problem& p, const Inputs& in, void* stream);

// pair_group (backward): how many (sequence, head) pairs the task list interleaves rank by rank (plan.cu).
// key_block (backward): key chunks per main-kernel task, 1, or 2 for the two-chunk kernel (kernels/bwd_main_pair.cuh:
// a task is then the block's first chunk, blocks start at the sequence's first chunk and every second one after).
Plan make_plan(const std::vector<Segment>& segs, int H, bool backward, int pair_group = 1, int key_block = 1);
// The block tables of the two-level carry for blocks of `block` chunks (0: off, the tables stay empty). Pinned by
// tests/cuda/test_cuda_plan.cpp.
void add_carry_blocks(Plan& plan, int block);
// The two-level forward's block size by count (PATHATTN_FWD_BLOCK=-1; docs/perf/notes.md "The two-level forward on
// the GPU"), for sequences of up to `chunks` chunks, `group` query heads per kv head, head dimension D: the B that
// minimises, per (chunk, kv head) and in C x D x D products, the query steps group ((B - 1) / 2 + chunks / (2 B)) plus
// the block preprocess's sweep form (1 for K', D / 64 for X: the same at every B), or 0 (per chunk) where that is not
// at least a quarter below the per-chunk steps group (chunks - 1) / 2. Counted, not measured.
int fwd_block_by_count(int chunks, int group, int D);
// The forward's block size when PATHATTN_FWD_BLOCK is unset. Measured on an H100 (thirtieth session, stage medians
// of bench_fwd, main + blocks against main without): D = 128 gains from 64 chunks on (32 x 4096: 9.91 -> 9.0-9.2 ms
// at B = 4-16; 8 x 16384: 38.3 -> 25.9-28.6) and fwd_block_by_count leaves 16 chunks per chunk (32 x 1024: a tie);
// D = 64 loses at 64 chunks (8.03 -> 8.9-9.0 at 32 x 4096) and gains ~5% at 256 (30.8 -> 29.2-29.4 at 8 x 16384).
// So: by count at D = 128, by count from 256 chunks at D = 64, else 0.
int fwd_block_default(int chunks, int group, int D);
// The two-level backward's block size (docs/math.md Eq. 54-57) for a longest sequence of `chunks` chunks: env
// PATHATTN_BWD_BLOCK (read once; kBwdBlockUnset when unset), 0 (off), B >= 1, or -1: by count, a key chunk's chain
// steps (B - 1) / 2 + chunks / (2 B) against (chunks - 1) / 2 (fwd_block_by_count's rule with one query head);
// unset, bwd_block_default. Measured on an H100 (thirty-first session, docs/perf/results.md; bwd det / fast ms,
// blocks off -> 8 -> by count): D = 64 32 x 4096 96.2 / 81.2 -> 89.0 / 75.7 -> 88.6 / 70.1, 8 x 16384 264.6 / 202.6
// -> 224.1 / 144.8 -> 233.9 / 139.7; D = 128 32 x 4096 162.5 / 124.9 -> 137.6 / 88.9 -> 137.6 / 88.5, 8 x 16384
// 502.5 / 355.6 -> 350.6 / 170.2 -> 361.2 / 163.7; at 32 x 1024 (16 chunks) blocks lose in both modes (the block
// kernels cost what the main kernel saves; again in the forty-first: 2.8 -> 3.5 ms at D = 64). Since the
// deterministic turns' waits came to dominate at D = 128 (notes, "The deterministic turns at D = 128"), the best
// size depends on the mode (forty-first session, bwd_main ms, blocks 4 / 8 / 16, two rounds): D = 128 deterministic
// 16 x 4096 21.9 / 25.0 / 27.3, 32 x 4096 43.9 / 50.0 / -, 4 x 16384 84.0 / 94.4 / 100.3, 8 x 16384 168.4 / 189.8 /
// 179.7, 2 x 32768 149.9 / 141.4 / 147.2; D = 128 fast 16 x 4096 17.6 / 15.9 / 17.6, 32 x 4096 - / 32.3 / 35.6,
// 4 x 16384 68.2 / 56.1 / 52.6, 8 x 16384 - / 113.5 / 106.8, 2 x 32768 136.7 / 109.8 / 99.1; D = 64 deterministic
// 32 x 4096 29.8 / 30.3 / 33.5 (with bwd_blocks' +0.2 for 4: a tie), 8 x 16384 109.1 / 109.2 / 116.4; D = 64 fast
// 32 x 4096 23.6 / 22.2 / 23.3, 8 x 16384 87.4 / 78.1 / 75.4. So, from 64 chunks on: deterministic, 4 at D = 128
// below 512 chunks, else 8; fast, 8 below 256 chunks, else 16; below 64 chunks off. key_block 2 (the two-chunk
// kernel) rounds an odd size up, so that a task's two chunks share a block.
constexpr int kBwdBlockUnset = -2;
int bwd_block_default(int chunks, int D, bool deterministic);
int bwd_block_setting();
int bwd_block_for(int chunks, int D, int key_block, bool deterministic);
// The backward's plan: make_plan's task list, with the block tables of the two-level backward when bwd_block_for
// turns it on (api.cu's backward and the workspace tables' tests build it alike).
Plan backward_plan(const std::vector<Segment>& segs, int H, int pair_group, int key_block, int D, bool deterministic);
// The backward main kernel's carried key copies per task (BwdParams::slot_chunks, the slots' size): one per level of
// the task (cuda/bwd_blocks.h), at most, over every task of the plan; without blocks max_chunks (one per later chunk,
// and one spare). With blocks of 8 at 256 chunks: 39 instead of 256, so the slots (the largest part of the
// backward's scratch at long T) shrink as the chain steps do.
int bwd_slot_chunks(const Plan& plan);
// Whether the two-level backward's setting needs the mma.sync main kernel (kernels/bwd_main.cuh) at this D: the
// two-chunk wgmma kernel (D = 64, bwd_main_pair.cuh) runs blocks of an even size or by count (rounded up), the D =
// 128 one (bwd_main_wide.cuh) any size; so only an odd size at D = 64.
bool bwd_blocks_need_mma(int D);

// The backward's pair_group for a longest sequence of `rows` tokens: about 16384 rows of pairs interleaved, at most 8
// pairs. Measured on the H200 (docs/perf/notes.md, deterministic main kernel, H 32, D 64): at 32 x 4096, 1 / 2 / 4 / 8
// / 16 pairs took 69.5 / 65.6 / 62.7 / 62.0 / 70.0 ms (more pairs than L2 holds lose locality); at 8 x 16384, 1 / 4
// / 16 took 269.7 / 275.4 / 355.4 ms.
inline int bwd_pair_group(int64_t rows) {
  return static_cast<int>(std::clamp<int64_t>(16384 / std::max<int64_t>(rows, 1), 1, 8));
}

// Decode: blocks per (sequence, kv head) of the split kernel (kernels/decode.cuh), from sizes the host knows (the
// cache's lengths live on the device and split evenly inside the kernel): enough blocks for four waves over `sms`
// multiprocessors (one full wave when B H <= sms / 8), but at least kDecodeMinRows cache rows per split at a full
// cache (Tmax), at most kDecodeMaxSplits. Pinned by tests/cuda/test_cuda_plan.cpp.
constexpr int kDecodeMinRows = 128;  // kDecodeMaxSplits: decode_params.h (the combine kernel sizes by it)
// blocks_per_sm: split blocks of the chosen kernel resident per SM (2; 1 for the tensor-core kernel at D = 128,
// decode_split_blocks_per_sm in decode_launch.h), which sizes the one-wave case.
int decode_splits(int64_t B, int64_t H, int64_t Tmax, int sms, int blocks_per_sm = 2);

}  // namespace pathattn::cuda
