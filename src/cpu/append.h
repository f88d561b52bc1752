// One chunk of new tokens attending to a sequence's history and joining it: the step shared by the CPU
// forward (prefill, chunk after chunk) and decoding (S new tokens on an existing key cache). docs/math.md
// Eq. 12-17.
#pragma once

#include <vector>

#include "common/problem.h"
#include "cpu/chunk.h"

namespace pathattn::cpu {

// Rows [0, r0 + n) of one (sequence, kv head), contiguous float32.
struct History {
  int64_t D = 0, DV = 0, G = 0;
  float* cache = nullptr;         // [r0 + n, D]: rows [0, r0) hold the earlier keys carried to row r0 (Eq. 17)
  const float* v = nullptr;       // [r0 + n, DV] values of every row, the new chunk's included
  const double* gcum = nullptr;   // [G, gstride] cumulative gates G_t of every row, or null (no gate)
  int64_t gstride = 0;
};

// The new chunk's rows: query head j's queries at q + j * qstride ([n, D]); its outputs at o + j * ostride
// ([n, DV]) and lse + j * lstride ([n]).
struct ChunkRows {
  const float* q = nullptr;
  int64_t qstride = 0;
  const float* k = nullptr;     // [n, D]
  const float* w = nullptr;     // [n, D]
  const float* beta = nullptr;  // [n]
  float* o = nullptr;
  int64_t ostride = 0;
  float* lse = nullptr;
  int64_t lstride = 0;
};

// Reusable buffers of append_chunk.
struct AppendScratch {
  std::vector<float> T, U, Kcorr, Khat, QWl, Qhat, S, logits, X;
};

// Attends rows [r0, r0 + n) (n <= kChunk) to rows [0, r0 + n), then carries the cache over the chunk and
// appends the chunk's end-carried keys: on exit cache rows [0, r0 + n) hold every key carried to row r0 + n.
void append_chunk(const Problem& p, const History& h, int64_t r0, int64_t n, const ChunkRows& c, AppendScratch& s);

}  // namespace pathattn::cpu
