#include "checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "config_io.h"

namespace pathattn::model {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("checkpoint: cannot read " + p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::trunc);
  f << text;
  if (!f) throw std::runtime_error("checkpoint: cannot write " + p.string());
}

// The folder holding the checkpoint: `dir`, or `dir`.old when a save was interrupted between its two renames.
fs::path resolve(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "step.txt")) return dir;
  const fs::path old = dir + ".old";
  if (fs::exists(old / "step.txt")) return old;
  return dir;
}

// Parameters and buffers by name (the state that torch::save writes).
std::map<std::string, torch::Tensor> state_of(Transformer& m) {
  std::map<std::string, torch::Tensor> s;
  for (const auto& p : m->named_parameters()) s[p.key()] = p.value();
  for (const auto& b : m->named_buffers()) s[b.key()] = b.value();
  return s;
}

}  // namespace

bool has_checkpoint(const std::string& dir) { return fs::exists(resolve(dir) / "step.txt"); }

void save_checkpoint(Transformer& model, torch::optim::AdamW& opt, const std::string& dir, const TrainerState& state,
                     const std::string& data_state) {
  const fs::path tmp = dir + ".tmp", old = dir + ".old";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  torch::save(model, (tmp / "model.pt").string());
  torch::save(opt, (tmp / "optim.pt").string());
  write_text(tmp / "config.txt", config_to_text(model->config()));
  write_text(tmp / "data.txt", data_state);
  // %.17g: doubles round-trip exactly, so the resumed run's next train_loss equals the uninterrupted run's.
  char counters[128];
  std::snprintf(counters, sizeof counters, "%ld\n%.17g %ld\n%.17g\n", static_cast<long>(state.step), state.loss_sum,
                static_cast<long>(state.loss_count), state.seconds);
  write_text(tmp / "step.txt", counters);  // last: a folder with step.txt is complete
  fs::remove_all(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  fs::remove_all(old);
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  const fs::path d = resolve(dir);
  CheckpointInfo info;
  std::istringstream counters(read_text(d / "step.txt"));
  if (!(counters >> info.state.step)) throw std::runtime_error("checkpoint " + d.string() + ": step.txt has no step");
  // Older checkpoints hold the step alone: the counters then start from zero.
  if (!(counters >> info.state.loss_sum >> info.state.loss_count >> info.state.seconds)) {
    info.state.loss_sum = 0;
    info.state.loss_count = 0;
    info.state.seconds = 0;
  }
  if (!fs::exists(d / "config.txt"))
    throw std::runtime_error("checkpoint " + d.string() + ": no config.txt (written by an older trainer?)");
  info.config = config_from_text(read_text(d / "config.txt"));
  if (fs::exists(d / "data.txt")) info.data_state = read_text(d / "data.txt");
  return info;
}

void load_checkpoint(Transformer& model, torch::optim::AdamW& opt, const std::string& dir, torch::Device dev) {
  const fs::path d = resolve(dir);
  const auto info = read_checkpoint_info(dir);
  const std::string diff = config_diff(info.config, model->config());
  if (!diff.empty()) throw std::runtime_error("checkpoint " + d.string() + " holds another model (" + diff + ")");
  torch::load(model, (d / "model.pt").string(), dev);
  torch::load(opt, (d / "optim.pt").string(), dev);
}

Transformer load_model(const std::string& dir, torch::Device dev) {
  const auto info = read_checkpoint_info(dir);
  Transformer m(info.config);
  torch::load(m, (resolve(dir) / "model.pt").string(), dev);
  m->to(dev);
  return m;
}

InitReport init_from_checkpoint(Transformer& model, const std::string& dir) {
  if (!has_checkpoint(dir)) throw std::runtime_error("--init-from: no checkpoint in " + dir + " (expected step.txt)");
  auto src = load_model(dir, torch::kCPU);
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
      s << "--init-from " << dir << ": " << name << " has shape " << it->second.sizes() << " there, " << t.sizes()
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
