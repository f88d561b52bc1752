// A checkpoint directory (pathattn_train's <out>/ckpt): the files, their writer and their readers, in one place.
//   model.pt    torch::save of the Transformer (parameters under their module names)
//   optim.pt    torch::save of the AdamW state (for --resume)
//   step.txt    the number of steps done
//   config.txt  the ModelConfig and the task (name and options): what rebuilding the model needs, as `key value`
//               lines (run_config_text below)
#pragma once

#include <torch/torch.h>

#include <string>

#include "config.h"
#include "task.h"
#include "transformer.h"

namespace pathattn::model {

// Writes all four files into dir (created if missing).
void save_checkpoint(Transformer& model, const Task& task, torch::optim::AdamW& opt, const std::string& dir,
                     int64_t step);

// Whether dir holds a checkpoint to resume from (its step.txt is there).
bool checkpoint_exists(const std::string& dir);
// The trainer's resume: loads model.pt and optim.pt into the given model and optimizer, returns step.txt's step.
int64_t load_training_state(Transformer& model, torch::optim::AdamW& opt, const std::string& dir, torch::Device dev);

// The config file's text: one `key value` line per field of ModelConfig (doubles to 17 significant digits, so a
// round trip is exact), then `task <name>` and the options of that task (prefixed `flipflop.`, `a5.`, `mqrar.`).
std::string run_config_text(const ModelConfig& model, const TaskConfig& task);
// Parses that text (blank lines and # comments skipped; a missing key keeps its default). Throws
// std::invalid_argument naming `source`, the line and the key for an unknown key or a bad value.
void parse_run_config(const std::string& text, const std::string& source, ModelConfig& model, TaskConfig& task);

struct LoadedCheckpoint {
  Transformer model{nullptr};  // built from config.txt, weights from model.pt, on the requested device, eval mode
  TaskConfig task;
  int64_t step = 0;
  std::string dir;  // the checkpoint directory that was read
};

// Loads a checkpoint for inference. path: a checkpoint directory, or a run directory holding ckpt/ (pathattn_train's
// --out). Throws std::invalid_argument naming `checkpoint`, the path and the missing or bad file.
LoadedCheckpoint load_checkpoint(const std::string& path, torch::Device dev = torch::kCPU);

}  // namespace pathattn::model
