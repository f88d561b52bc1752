#include "checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "config_io.h"
#include "dir_ops.h"

namespace pathattn::model {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModel = "model.pt";
constexpr const char* kOptim = "optim.pt";
constexpr const char* kStep = "step.txt";
constexpr const char* kConfig = "config.txt";
constexpr const char* kData = "data.txt";

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("checkpoint: " + what); }

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  if (!f) fail("cannot read '" + p.string() + "'");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::trunc);
  f << text;
  if (!f) throw std::runtime_error("checkpoint: cannot write " + p.string());
}

void require(const fs::path& p, const std::string& why) {
  if (fs::exists(p)) return;
  std::string what = "'";  // appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "'" + s + ...
  what += p.string();
  what += "' not found";
  what += why;
  fail(what);
}

// The folder holding the checkpoint that `path` names (checkpoint.h), or an empty path when there is none.
fs::path find_checkpoint(const std::string& path) {
  if (path.empty()) return {};
  fs::path p = path;
  if (!p.has_filename()) p = p.parent_path();  // "run/ckpt/"
  for (const fs::path& d : {p, p / "ckpt"})
    for (const fs::path& c : {d, fs::path(d.string() + ".old")})
      if (fs::exists(c / kStep)) return c;
  return {};
}

// Parameters and buffers by name (the state that torch::save writes).
std::map<std::string, torch::Tensor> state_of(Transformer& m) {
  std::map<std::string, torch::Tensor> s;
  for (const auto& p : m->named_parameters()) s[p.key()] = p.value();
  for (const auto& b : m->named_buffers()) s[b.key()] = b.value();
  return s;
}

}  // namespace

bool has_checkpoint(const std::string& path) { return !find_checkpoint(path).empty(); }

std::string checkpoint_dir(const std::string& path) {
  if (path.empty()) fail("expected a checkpoint folder (or a run folder holding ckpt/), got an empty path");
  const fs::path d = find_checkpoint(path);  // also where only <path>.old is left
  if (d.empty()) {
    if (!fs::is_directory(path)) fail("'" + path + "' is not a directory");
    fail("no checkpoint in '" + path + "': '" + (fs::path(path) / kStep).string() + "' not found, nor ckpt/" + kStep +
         " (a checkpoint folder holds " + kModel + ", " + kOptim + ", " + kStep + ", " + kConfig + " and " + kData +
         ", written by pathattn_train)");
  }
  return d.string();
}

void save_checkpoint(Transformer& model, torch::optim::AdamW& opt, const std::string& dir, const TrainerState& state,
                     const TaskConfig& task, const std::string& data_state) {
  const fs::path tmp = dir + ".tmp", old = dir + ".old";
  remove_tree(tmp.string());
  fs::create_directories(tmp);
  torch::save(model, (tmp / kModel).string());
  torch::save(opt, (tmp / kOptim).string());
  write_text(tmp / kConfig, config_to_text(model->config(), task));
  write_text(tmp / kData, data_state);
  // %.17g: doubles round-trip exactly, so the resumed run's next train_loss equals the uninterrupted run's.
  char counters[128];
  std::snprintf(counters, sizeof counters, "%ld\n%.17g %ld\n%.17g\n", static_cast<long>(state.step), state.loss_sum,
                static_cast<long>(state.loss_count), state.seconds);
  write_text(tmp / kStep, counters);  // last: a folder with step.txt is complete
  remove_tree(old.string());
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  remove_tree(old.string());
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const fs::path d = checkpoint_dir(path);
  CheckpointInfo info;
  info.dir = d.string();
  std::istringstream counters(read_text(d / kStep));
  if (!(counters >> info.state.step)) fail("'" + (d / kStep).string() + "' holds no step");
  // Older checkpoints hold the step alone: the counters then start from zero.
  if (!(counters >> info.state.loss_sum >> info.state.loss_count >> info.state.seconds)) {
    info.state.loss_sum = 0;
    info.state.loss_count = 0;
    info.state.seconds = 0;
  }
  require(d / kConfig, " (checkpoints written before config.txt held the task cannot be rebuilt: retrain)");
  const auto rc = config_from_text(read_text(d / kConfig), (d / kConfig).string());
  info.config = rc.model;
  info.task = rc.task;
  if (fs::exists(d / kData)) info.data_state = read_text(d / kData);
  return info;
}

void load_training_state(Transformer& model, torch::optim::AdamW& opt, const CheckpointInfo& info,
                         torch::Device dev) {
  const std::string diff = config_diff(info.config, model->config());
  if (!diff.empty()) throw std::runtime_error("checkpoint " + info.dir + " holds another model (" + diff + ")");
  const fs::path d = info.dir;
  for (const char* f : {kModel, kOptim}) require(d / f, "");
  torch::load(model, (d / kModel).string(), dev);
  torch::load(opt, (d / kOptim).string(), dev);
}

LoadedCheckpoint load_checkpoint(const std::string& path, torch::Device dev) {
  LoadedCheckpoint r;
  r.info = read_checkpoint_info(path);
  const fs::path cfg = fs::path(r.info.dir) / kConfig, weights = fs::path(r.info.dir) / kModel;
  try {
    r.info.config.validate();
    if (dev.is_cuda()) r.info.config.validate_on_cuda();
  } catch (const std::invalid_argument& e) {
    fail(cfg.string() + ": " + e.what());
  }
  require(weights, "");
  r.model = Transformer(r.info.config);
  try {
    torch::load(r.model, weights.string(), dev);
  } catch (const c10::Error& e) {
    fail("'" + weights.string() + "' does not load into the model of " + kConfig + ": " + e.what_without_backtrace());
  }
  r.model->to(dev);
  r.model->eval();
  return r;
}

InitReport init_from_checkpoint(Transformer& model, const std::string& path) {
  if (!has_checkpoint(path))
    throw std::invalid_argument("--init-from: no checkpoint in " + path + " (expected step.txt, or ckpt/step.txt)");
  auto src = load_checkpoint(path, torch::kCPU).model;
  auto from = state_of(src), to = state_of(model);
  InitReport r;
  torch::NoGradGuard ng;
  for (auto& [name, t] : to) {
    auto it = from.find(name);
    if (it == from.end()) {
      r.fresh.push_back(name);
      continue;
    }
    if (it->second.sizes() != t.sizes()) {
      std::ostringstream s;
      s << "--init-from " << path << ": " << name << " has shape " << it->second.sizes() << " there, " << t.sizes()
        << " here";
      throw std::runtime_error(s.str());
    }
    t.copy_(it->second);  // to the model's device and dtype
    r.copied.push_back(name);
  }
  for (const auto& [name, t] : from)
    if (!to.count(name)) r.dropped.push_back(name);
  return r;
}

std::string format_init_report(const InitReport& r, const std::string& dir) {
  std::ostringstream s;
  s << "init from " << dir << ": " << r.copied.size() << " tensors copied, " << r.fresh.size()
    << " new (fresh initialisation), " << r.dropped.size() << " dropped\n";
  for (const auto& n : r.copied) s << "copied  " << n << "\n";
  for (const auto& n : r.fresh) s << "new     " << n << "\n";
  for (const auto& n : r.dropped) s << "dropped " << n << "\n";
  return s.str();
}

}  // namespace pathattn::model
