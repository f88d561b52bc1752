// ModelConfig as text (key=value lines), written beside every checkpoint so that a checkpoint alone says which
// model it holds: the evaluation program and --init-from rebuild the model from it, and a resume with a different
// model is refused with the keys that differ instead of failing inside torch::load.
#pragma once

#include <string>

#include "config.h"

namespace pathattn::model {

std::string config_to_text(const ModelConfig& c);
// Throws std::invalid_argument naming a missing, unknown or malformed key.
ModelConfig config_from_text(const std::string& text);
// The keys whose values differ ("" when equal), e.g. "mechanism: rope vs path".
std::string config_diff(const ModelConfig& a, const ModelConfig& b);

}  // namespace pathattn::model
