// The plain struct the CUDA decode kernels see (kernels/decode.cuh): pointers, strides (elements) and sizes.
// Filled by api.cu's decode() once per call; one launch pair (split kernel, combine kernel) per new token.
// Kept apart from params.h (the forward's and backward's structs) so that the decode's files build on their own.
#pragma once

#include <cstdint>

#include "cuda/params.h"  // Strides

namespace pathattn::cuda {

// At most this many split blocks per (sequence, kv head) (plan.cu's decode_splits; the combine kernel keeps one
// weight per split in shared memory).
constexpr int kDecodeMaxSplits = 1024;
// The chunked decode's cap on them (api.cu): its partials grow with the chunk's tokens.
constexpr int kDecodeChunkMaxSplits = 64;

struct DecodeParams {
  // The step's new tokens (device pointers), [B, S, ...] views; the launch for token `step` reads t = step.
  const void* q;      // [B, S, HQ, D]  bf16 / f16 (the kernel's T)
  const void* k;      // [B, S, H, D]
  const void* v;      // [B, S, H, D]   (DV == D)
  const void* w;      // [B, S, H, D]   f32 or bf16 (w_is_bf16)
  const float* beta;  // [B, S, H]
  const float* g;     // [B, S, HQ] or null (no gate)
  Strides sq, sk, sv, sw, sbeta, sg;
  bool w_is_bf16;
  int step;           // which of the S new tokens this launch pair appends (0 .. S-1)
  int S;

  // The caller's cache, rows [0, lengths[b]) valid; updated in place.
  void* ck;           // [B, Tmax, H, D]   keys carried to the sequence's last token (docs/math.md Eq. 3), f32 or
  bool ck_bf16;       //                   bf16 (ck_bf16: rounded at every carry)
  void* cv;           // [B, Tmax, H, D]   f32, or T (cv_low: the values as given, exactly)
  bool cv_low;
  void* cg;           // [B, Tmax, HQ]     cumulative gates G_j, f32 or f64 (cg_f64); null without gate
  bool cg_f64;
  Strides sck, scv, scg;
  int32_t* lengths;   // [B] on the device: read by the split kernel, advanced by the combine kernel
  int64_t slen;       // stride of lengths
  int Tmax;

  // Outputs of the step.
  void* o;            // [B, S, HQ, D]  T
  float* lse;         // [B, S, HQ]     natural log
  Strides so, slse;

  int B, H, HQ, group;
  int num_splits;     // blocks per (sequence, kv head), each a contiguous share of the cached rows
  float scale_log2;   // scale * log2(e): logits in base 2

  // The checkpointed cache (docs/math.md Eq. 35-37; kernels/decode_checkpoint.cuh), or ckpt == nullptr: the plain
  // cache. Rows [0, ckpt[b]) are carried to the checkpoint only, read with the carried-back query.
  int32_t* ckpt;      // [B] on the device: read by the carry kernel, moved by the refresh kernel
  int64_t sckpt;
  float* carry;       // [B, H, D, D] contiguous: M = H_ckpt ... H_t, stale (meaning I) when nothing is pending
  int period;         // P: the old rows are carried by M when P tokens are pending
  int32_t* ckpt_snap; // [B] workspace: ckpt[b] as this step's carry kernel read it, or -1 when the cache breaks
                      //     0 <= lengths - ckpt < P (the sequence then gets NaN and is left alone)
  float* qcarried;    // [B, HQ, D] workspace: M_t q_t per query head (Eq. 35), the carry kernel's output

  // A call of several tokens as chunks of Eq. 43 (kernels/decode_chunk.cuh; the plain cache, decode_uses_chunks in
  // launch/decode_launch.h): the chunk's tokens are step .. step + chunk_n - 1 (chunk_n <= 64).
  int chunk_n;
  bool commit;        // false: o and lse only; the cache, gates and lengths are left as they were (chunks only)
  int chunk_rows;     // min(S, 64): tokens per chunk the partials have room for; 0: single steps, not chunks
  float* chunk_u;     // [B, H, 64, D] workspace: the chunk's U = T b W (Eq. 10), f32, zero past chunk_n
  float* chunk_w;     // [B, H, 64, D] workspace: its W in f32
  float* chunk_q;     // [B, HQ, 64, D] workspace: the queries carried to the chunk's start, Q^ (Eq. 13)
  double* chunk_g;    // [B, HQ, 64] workspace: G of the chunk's tokens (gate only)

  // Workspace.
  float* part_o;      // [B, HQ, num_splits, D]  each split's unnormalised sum of p v (chunks: [B, HQ,
                      //                         chunk_rows, num_splits + 1, D], slot num_splits the chunk's own)
  float* part_ml;     // [B, HQ, num_splits, 2]  its running max (base 2) and sum of p (chunks: as part_o)
  int32_t* len_snap;  // [B]  lengths[b] before the call, as step 0's split kernel read it: later steps and the
                      //      combine kernel go by it (a call that does not fit changes nothing, at any step)
};

}  // namespace pathattn::cuda
