// Language modelling on pre-tokenised shards (lm_shard.h): the `lm` task of the trainer.
//
// Training: each example is a window of T + 1 consecutive tokens of the train stream (input the first T, target
// the last T), its start drawn uniformly from the batch's generator. The trainer seeds that generator from (seed,
// step, micro-batch), so the data order is a function of the seed alone: the same for every mechanism, and the
// same after a resume. Evaluation: `valid`, fixed windows of T + 1 tokens evenly spaced over the validation stream
// (even_windows), the same on every call and in every run. Every position is scored (next-token loss).
#pragma once

#include <memory>
#include <string>

#include "lm_shard.h"
#include "task.h"

namespace pathattn::model {

// LmConfig, the task's options: task.h (TaskConfig holds them).

// `count` windows of `len` tokens, evenly spaced over the stream: window i starts at i * (N - len) / (count - 1)
// (integer arithmetic; one window starts at 0). Overlapping when the stream is short. Throws when N < len.
Batch even_windows(const lm::TokenStream& stream, int64_t count, int64_t len_plus_one);

// The train stream's window start for a generator draw: r mod (N - T) (T + 1 tokens fit from any start below).
// Not std::uniform_int_distribution: its mapping differs between standard libraries, and the data order must not.
int64_t window_start(uint64_t r, int64_t stream_size, int64_t seq_len);

std::unique_ptr<Task> make_lm(const LmConfig& cfg);  // make_task(TaskConfig{"lm", ...}) calls it

}  // namespace pathattn::model
