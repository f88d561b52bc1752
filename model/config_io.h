// The text of a checkpoint's config.txt: the model (ModelConfig) and the task it was trained on (TaskConfig) as
// key=value lines, written beside every checkpoint so that the folder alone says what it holds: the inference
// loader (pathattn_generate, pathattn_lm_eval) and --init-from rebuild the model from it, make_task rebuilds the
// task (pathattn_generate --sample / --eval-reads), and a resume with a different model is refused with the keys
// that differ instead of failing inside torch::load. Also the key=value reader of the checkpoint's other text
// (data.txt, checkpoint.h).
#pragma once

#include <string>
#include <vector>

#include "config.h"
#include "task.h"

namespace pathattn::model {

// One line of key=value text: the key, the value (everything after the first '=') and the line number (from 1).
struct KeyValue {
  std::string key, value;
  int line = 0;
};
// Splits key=value lines (blank lines skipped). Throws std::invalid_argument naming `source` and the line for a
// line without '=', an empty key, or a key given twice.
std::vector<KeyValue> parse_key_values(const std::string& text, const std::string& source);
// The value of `key` among them; throws std::invalid_argument naming `source` and the key when it is missing.
std::string key_value(const std::vector<KeyValue>& kv, const std::string& key, const std::string& source);

struct RunConfig {
  ModelConfig model;
  TaskConfig task;
};

// Every field of ModelConfig (doubles to 17 significant digits, so a round trip is exact; flags 0 / 1), then
// task=<name> and that task's options as <name>.<option>=value (flipflop.pairs=256, lm.data_dir=..., ...).
std::string config_to_text(const ModelConfig& model, const TaskConfig& task);
// The inverse. Every key of the model and of the named task must be there, and nothing else: throws
// std::invalid_argument naming `source`, the line and the key for an unknown key or a malformed value, and the key
// that is missing.
RunConfig config_from_text(const std::string& text, const std::string& source = "config");
// The model keys whose values differ ("" when equal), e.g. "mechanism: rope vs path".
std::string config_diff(const ModelConfig& a, const ModelConfig& b);

}  // namespace pathattn::model
