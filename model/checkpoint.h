// Checkpoints of the trainer (pathattn_train's <out>/ckpt): the files, their one writer and their readers.
//   model.pt, optim.pt   the weights and AdamW's state (torch::save)
//   step.txt             the trainer's counters: optimizer steps done, the running sum and count of training
//                        losses since the last evaluation (its train_loss), cumulative training seconds
//   config.txt           the model and the task it trains on (config_io.h), so that the folder alone rebuilds both
//   data.txt             the data stream's state: the task, seed, batch, micro-batches per step, and what the task
//                        reads (task.h data_state), as key=value lines. Batch s is a function of these and s
//                        (trainer.cpp), so with step.txt this is the whole iterator state. Also the evaluation set's
//                        size and the learning-rate schedule. A resume whose data.txt differs is refused (its curve
//                        would not continue this one).
// A checkpoint is written to <dir>.tmp and then renamed over <dir>, so a run killed while saving (a device
// command past its time limit) leaves the previous checkpoint intact.
//
// Every reader takes a path that names a checkpoint: the checkpoint folder, or a run folder holding ckpt/
// (pathattn_train's --out), each also found as <dir>.old where a save was interrupted between its two renames.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "config.h"
#include "task.h"
#include "transformer.h"

namespace pathattn::model {

// What the training loop carries from step to step besides the model and optimizer.
struct TrainerState {
  int64_t step = 0;
  double loss_sum = 0;  // training losses since the last evaluation (its train_loss is their mean)
  int64_t loss_count = 0;
  double seconds = 0;  // training time of all invocations so far
};

struct CheckpointInfo {
  std::string dir;  // the checkpoint folder that was read (the path resolved as above)
  TrainerState state;
  ModelConfig config;
  TaskConfig task;
  std::string data_state;  // data.txt, verbatim ("" when absent)
};

// Whether `path` names a checkpoint (a folder as above with its step.txt, written last).
bool has_checkpoint(const std::string& path);
// The checkpoint folder that `path` names. Throws std::invalid_argument ("checkpoint: ...") naming the path and
// the missing file.
std::string checkpoint_dir(const std::string& path);

void save_checkpoint(Transformer& model, torch::optim::AdamW& opt, const std::string& dir, const TrainerState& state,
                     const TaskConfig& task, const std::string& data_state);
// step.txt, config.txt and data.txt. Throws std::invalid_argument naming the path and the missing or bad file
// (a bad config.txt: its line and key).
CheckpointInfo read_checkpoint_info(const std::string& path);
// The trainer's resume: the weights and optimizer state of `info` into an existing model (its config must equal
// the checkpoint's: throws with the keys that differ) and optimizer.
void load_training_state(Transformer& model, torch::optim::AdamW& opt, const CheckpointInfo& info,
                         torch::Device dev);

// Inference: a new model built from config.txt with the checkpoint's weights, on dev, in eval mode, and what the
// checkpoint records (the task: make_task(info.task) rebuilds it). Errors as read_checkpoint_info, and name
// model.pt when it is missing or does not fit config.txt's model.
struct LoadedCheckpoint {
  Transformer model{nullptr};
  CheckpointInfo info;
};
LoadedCheckpoint load_checkpoint(const std::string& path, torch::Device dev = torch::kCPU);

// Start `model` from another checkpoint's weights, matched by name (e.g. a PaTH model from a trained RoPE one:
// the paper's conversion). Tensors in both are copied (their shapes must agree, else it throws naming the tensor);
// tensors only in `model` keep their fresh initialisation (the layer's own); tensors only in the checkpoint are
// dropped. Nothing else is taken: not the optimizer, not the step.
struct InitReport {
  std::vector<std::string> copied, fresh, dropped;
};
InitReport init_from_checkpoint(Transformer& model, const std::string& path);
std::string format_init_report(const InitReport& r, const std::string& dir);

}  // namespace pathattn::model
