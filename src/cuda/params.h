// The plain structs the CUDA kernels see: pointers, strides (in elements) and sizes, nothing else.
// Built once on the host by api.cu; dispatch.cu turns dtype / D / gate into template arguments.
#pragma once

#include <cstdint>

namespace pathattn::cuda {

constexpr int kChunk = 64;  // C: tokens per chunk, rows of one UT factor (docs/math.md Eq. 10)

// One chunk of one sequence. Chunks restart at each sequence start (varlen), so only a sequence's
// last chunk can be shorter than kChunk.
struct ChunkInfo {
  int b;       // batch row
  int t0;      // first row of the chunk in the T dimension
  int len;     // 1..kChunk
  int first;   // global index of the first chunk of this chunk's sequence
};

// One sequence: its chunks are [first, first + count) in the global chunk numbering.
struct SeqInfo {
  int first;
  int count;
};

// Strides of a [B, T, X, Y] tensor (elements). Last dimension contiguous (checked by supports()).
struct Strides4 {
  int64_t b, t, h;
};
struct Strides3 {
  int64_t b, t, h;
};

// Per-(chunk, kv head) products of the preprocess kernel (Eq. 10-14), in the tensor-core dtype, rows padded
// to kChunk with zeros past the chunk's length. Index: ((chunk * H + h) * kChunk + row) * D + col.
struct Workspace {
  void* khat;     // [NC, H, C, D]  K^ (Eq. 14), keys carried to the chunk end
  void* u;        // [NC, H, C, D]  U = T b W (Eq. 10)
  void* w;        // [NC, H, C, D]  W in the tensor-core dtype
  void* m;        // [NC, H, C, C]  T b strict_lower(W K^T) (Eq. 12)
  void* step;     // [NC, H, D, D]  E = -U^T W: the query's step across the chunk, Q~ <- Q~ + Q~ E^T (Eq. 32)
  float* khat32;  // [NC, H, C, D]  f32 copies for the key cache (kcache only, else null)
  float* u32;     // [NC, H, C, D]
  float* w32;     // [NC, H, C, D]
  float* gl;      // [NC, HQ, C]    gate cumulated inside the chunk (gate only)
  double* goff;   // [NC, HQ]       gate cumulated over the sequence's earlier chunks (SPEC 6)
  double* gtot;   // [NC, HQ]       each chunk's gate total
};

struct Params {
  // Inputs (device pointers).
  const void* q;       // [B, T, HQ, D]   bf16 / f16
  const void* k;       // [B, T, H, D]
  const void* v;       // [B, T, H, D]    (DV == D)
  const void* w;       // [B, T, H, D]    f32 or bf16 (w_is_bf16)
  const float* beta;   // [B, T, H]
  const float* g;      // [B, T, HQ] or null
  Strides4 sq, sk, sv, sw, so, skc;
  Strides3 sbeta, sg, slse;
  bool w_is_bf16;
  // Outputs.
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
  const int* order;         // [NC] query chunks in schedule order (api.cu: longest sequence first, last chunk first)
  Workspace ws;
};

}  // namespace pathattn::cuda
