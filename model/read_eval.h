// Flip-flop reads answered by generation: the check that a trained model recalls the last written bit when it
// generates, through the KV cache, rather than only when the trainer scores a full forward.
#pragma once

#include <vector>

#include "generate.h"

namespace pathattn::model {

struct ReadScore {
  int64_t reads = 0;    // read instructions answered
  int64_t correct = 0;  // answers equal to the last written bit
  int64_t fed = 0;      // tokens fed through the cache (prefills and decode steps)
  double seconds = 0;
  std::vector<int64_t> answers;  // the generated token of each read, in order (sequence by sequence)
  double accuracy() const { return reads > 0 ? static_cast<double>(correct) / reads : 0.0; }
};

// Each flip-flop sequence (ff::sequence: instructions at even positions, bits at odd) through its own Decoder: fed
// up to and including a read instruction, then one token generated under s (seed s.seed + the sequence's index) and
// scored against the true next bit; then the true bit and the tokens up to the next read are fed in one decode step
// (teacher forcing: every answer comes from a cache holding the true sequence, so one wrong answer does not corrupt
// the rest). Tokens after the last read are not fed.
ReadScore score_flipflop_reads(Transformer& model, const std::vector<std::vector<int64_t>>& seqs,
                               const SamplingConfig& s = {});

}  // namespace pathattn::model
