#include "checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <variant>
#include <vector>

namespace pathattn::model {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModel = "model.pt";
constexpr const char* kOptim = "optim.pt";
constexpr const char* kStep = "step.txt";
constexpr const char* kConfig = "config.txt";

// The fields of the config file and the variables behind them: the one list both the writer and the reader use, so
// they cannot drift apart. A new numeric or boolean ModelConfig / task option is added here (the enums and the task
// name are written by hand below).
using Slot = std::variant<int64_t*, double*, bool*>;
using Fields = std::vector<std::pair<std::string, Slot>>;

Fields model_fields(ModelConfig& m) {
  return {{"vocab", &m.vocab},           {"n_layer", &m.n_layer},       {"d_model", &m.d_model},
          {"n_head", &m.n_head},         {"n_kv_head", &m.n_kv_head},   {"mlp_hidden", &m.mlp_hidden},
          {"qk_norm", &m.qk_norm},       {"beta_max", &m.beta_max},     {"w_rank", &m.w_rank},
          {"low_rank_w", &m.low_rank_w}, {"w_shortconv", &m.w_shortconv}, {"conv_size", &m.conv_size},
          {"rope_base", &m.rope_base}};
}

// Every task's options, keyed `<task>.<option>`; the writer keeps those of the named task.
Fields task_fields(TaskConfig& t) {
  return {{"flipflop.pairs", &t.flipflop.pairs}, {"flipflop.p_ignore", &t.flipflop.p_ignore},
          {"a5.length", &t.a5.length},           {"mqrar.n_back", &t.mqrar.n_back},
          {"mqrar.length", &t.mqrar.length},     {"mqrar.keys", &t.mqrar.keys},
          {"mqrar.values", &t.mqrar.values},     {"mqrar.p_query", &t.mqrar.p_query}};
}

std::string to_text(const Slot& s) {
  std::ostringstream o;
  if (auto* i = std::get_if<int64_t*>(&s)) o << **i;
  else if (auto* d = std::get_if<double*>(&s)) o << std::setprecision(std::numeric_limits<double>::max_digits10) << **d;
  else o << (*std::get<bool*>(s) ? "true" : "false");
  return o.str();
}

// Parses value into the slot; false when it is not a whole value of the slot's type.
bool from_text(const Slot& s, const std::string& value) {
  std::istringstream in(value);
  if (auto* b = std::get_if<bool*>(&s)) {
    if (value != "true" && value != "false") return false;
    **b = value == "true";
    return true;
  }
  if (auto* i = std::get_if<int64_t*>(&s)) in >> **i;
  else in >> *std::get<double*>(s);
  return !in.fail() && (in >> std::ws).eof();
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("checkpoint: " + what); }

}  // namespace

std::string run_config_text(const ModelConfig& model, const TaskConfig& task) {
  ModelConfig m = model;  // the field lists take non-const pointers
  TaskConfig t = task;
  std::ostringstream o;
  o << "# pathattn checkpoint: the model and task of this run (model/checkpoint.cpp)\n";
  o << "mechanism " << mechanism_name(m.mechanism) << "\n";
  o << "gate_scale " << gate_scale_name(m.gate_scale) << "\n";
  for (const auto& [key, slot] : model_fields(m)) o << key << " " << to_text(slot) << "\n";
  o << "task " << t.name << "\n";
  const std::string prefix = t.name + ".";
  for (const auto& [key, slot] : task_fields(t))
    if (key.compare(0, prefix.size(), prefix) == 0) o << key << " " << to_text(slot) << "\n";
  return o.str();
}

void parse_run_config(const std::string& text, const std::string& source, ModelConfig& model, TaskConfig& task) {
  Fields fields = model_fields(model);
  for (auto& f : task_fields(task)) fields.push_back(f);
  std::istringstream in(text);
  std::string line;
  std::set<std::string> seen;
  for (int n = 1; std::getline(in, line); ++n) {
    std::istringstream ls(line);
    std::string key, value, extra;
    if (!(ls >> key) || key[0] == '#') continue;
    const std::string where = source + " line " + std::to_string(n) + ": ";
    if (!(ls >> value) || (ls >> extra)) throw std::invalid_argument(where + "expected 'key value', got '" + line + "'");
    if (!seen.insert(key).second) throw std::invalid_argument(where + "key '" + key + "' given twice");
    try {
      if (key == "mechanism") { model.mechanism = parse_mechanism(value); continue; }
      if (key == "gate_scale") { model.gate_scale = parse_gate_scale(value); continue; }
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where + e.what());
    }
    if (key == "task") { task.name = value; continue; }
    auto it = std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return f.first == key; });
    if (it == fields.end()) throw std::invalid_argument(where + "unknown key '" + key + "'");
    if (!from_text(it->second, value))
      throw std::invalid_argument(where + key + ": '" + value + "' is not a valid value");
  }
}

void save_checkpoint(Transformer& model, const Task& task, torch::optim::AdamW& opt, const std::string& dir,
                     int64_t step) {
  const fs::path d = dir;
  fs::create_directories(d);
  torch::save(model, (d / kModel).string());
  torch::save(opt, (d / kOptim).string());
  std::ofstream(d / kStep) << step << "\n";
  std::ofstream(d / kConfig) << run_config_text(model->config(), task.config());
}

bool checkpoint_exists(const std::string& dir) { return fs::exists(fs::path(dir) / kStep); }

int64_t load_training_state(Transformer& model, torch::optim::AdamW& opt, const std::string& dir, torch::Device dev) {
  const fs::path d = dir;
  torch::load(model, (d / kModel).string(), dev);
  torch::load(opt, (d / kOptim).string(), dev);
  int64_t step = 0;
  std::ifstream(d / kStep) >> step;
  return step;
}

LoadedCheckpoint load_checkpoint(const std::string& path, torch::Device dev) {
  if (path.empty()) fail("expected a checkpoint directory (or a run directory holding ckpt/), got an empty path");
  fs::path d = path;
  if (!fs::is_directory(d)) fail("'" + path + "' is not a directory");
  if (!fs::exists(d / kModel) && fs::is_directory(d / "ckpt")) d /= "ckpt";  // a run directory (--out)
  for (const char* f : {kConfig, kModel}) {
    if (!fs::exists(d / f))
      fail("'" + (d / f).string() + "' not found (a checkpoint directory holds " + kConfig + " and " + kModel +
           ", written by pathattn_train; checkpoints written before config.txt existed need retraining)");
  }
  LoadedCheckpoint r;
  r.dir = d.string();
  ModelConfig mc;
  parse_run_config(read_file(d / kConfig), (d / kConfig).string(), mc, r.task);
  try {
    mc.validate();
  } catch (const std::invalid_argument& e) {
    fail((d / kConfig).string() + ": " + e.what());
  }
  r.model = Transformer(mc);
  r.model->to(dev);
  try {
    torch::load(r.model, (d / kModel).string(), dev);
  } catch (const c10::Error& e) {
    fail("'" + (d / kModel).string() + "' does not load into the model of " + kConfig + ": " + e.what_without_backtrace());
  }
  r.model->eval();
  if (fs::exists(d / kStep)) std::ifstream(d / kStep) >> r.step;
  return r;
}

}  // namespace pathattn::model
