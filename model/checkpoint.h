// Checkpoints of the trainer: a folder with
//   model.pt, optim.pt   the weights and AdamW's state (torch::save)
//   step.txt             the trainer's counters: optimizer steps done, the running sum and count of training
//                        losses since the last evaluation (its train_loss), cumulative training seconds
//   config.txt           the model (config_io.h), so that the folder alone rebuilds it
//   data.txt             the data stream's state: the seed, batch, micro-batches per step, and what the task reads
//                        (task.h data_state). Batch s is a function of these and s (trainer.cpp), so with step.txt
//                        this is the whole iterator state. Also the evaluation set's size and the learning-rate
//                        schedule. A resume whose data.txt differs is refused (its curve would not continue this one).
// A checkpoint is written to <dir>.tmp and then renamed over <dir>, so a run killed while saving (a device
// command past its time limit) leaves the previous checkpoint intact.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "config.h"
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
  TrainerState state;
  ModelConfig config;
  std::string data_state;  // data.txt, verbatim
};

bool has_checkpoint(const std::string& dir);
void save_checkpoint(Transformer& model, torch::optim::AdamW& opt, const std::string& dir, const TrainerState& state,
                     const std::string& data_state);
CheckpointInfo read_checkpoint_info(const std::string& dir);  // throws naming the missing file
// Weights and optimizer state into an existing model (its config must equal the checkpoint's: throws with the
// keys that differ) and optimizer.
void load_checkpoint(Transformer& model, torch::optim::AdamW& opt, const std::string& dir, torch::Device dev);
// A new model built from config.txt with the checkpoint's weights, on dev.
Transformer load_model(const std::string& dir, torch::Device dev);

// Start `model` from another checkpoint's weights, matched by name (e.g. a PaTH model from a trained RoPE one:
// the paper's conversion). Tensors in both are copied (their shapes must agree, else it throws naming the tensor);
// tensors only in `model` keep their fresh initialisation (the layer's own); tensors only in the checkpoint are
// dropped. Nothing else is taken: not the optimizer, not the step.
struct InitReport {
  std::vector<std::string> copied, fresh, dropped;
};
InitReport init_from_checkpoint(Transformer& model, const std::string& dir);
std::string format_init_report(const InitReport& r, const std::string& dir);

}  // namespace pathattn::model
