#include "config_io.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <stdexcept>
#include <variant>

namespace pathattn::model {

namespace {

// The fields of config.txt and the variables behind them: the one list that the writer, the reader and config_diff
// use, so they cannot drift apart. Keep it in step with config.h and task.h: a field missing here would not be
// saved, and a checkpoint would rebuild the model or task with its default.
using Slot = std::variant<int64_t*, double*, bool*, std::string*, Mechanism*, GateScale*>;
using Fields = std::vector<std::pair<std::string, Slot>>;

Fields model_fields(ModelConfig& c) {
  return {{"vocab", &c.vocab},           {"n_layer", &c.n_layer},         {"d_model", &c.d_model},
          {"n_head", &c.n_head},         {"n_kv_head", &c.n_kv_head},     {"mlp_hidden", &c.mlp_hidden},
          {"mechanism", &c.mechanism},   {"qk_norm", &c.qk_norm},         {"beta_max", &c.beta_max},
          {"w_rank", &c.w_rank},         {"low_rank_w", &c.low_rank_w},   {"w_shortconv", &c.w_shortconv},
          {"conv_size", &c.conv_size},   {"gate_scale", &c.gate_scale},   {"rope_base", &c.rope_base}};
}

// The options of the task t.name, keyed <task>.<option>; throws for an unknown task name. (FlipFlopConfig's
// evaluation mixtures are not options of the command line and not recorded: a rebuilt task has the defaults.)
Fields task_fields(TaskConfig& t) {
  if (t.name == "flipflop") return {{"flipflop.pairs", &t.flipflop.pairs}, {"flipflop.p_ignore", &t.flipflop.p_ignore}};
  if (t.name == "a5") return {{"a5.length", &t.a5.length}, {"a5.bos", &t.a5.bos}};
  if (t.name == "mqrar")
    return {{"mqrar.n_back", &t.mqrar.n_back}, {"mqrar.length", &t.mqrar.length}, {"mqrar.keys", &t.mqrar.keys},
            {"mqrar.values", &t.mqrar.values}, {"mqrar.p_query", &t.mqrar.p_query}};
  if (t.name == "lm")
    return {{"lm.data_dir", &t.lm.data_dir}, {"lm.seq_len", &t.lm.seq_len}, {"lm.train_shards", &t.lm.train_shards}};
  throw std::invalid_argument("task: expected flipflop, a5, mqrar or lm, got '" + t.name + "'");
}

std::string to_text(const Slot& s) {
  if (auto* i = std::get_if<int64_t*>(&s)) return std::to_string(**i);
  if (auto* d = std::get_if<double*>(&s)) {
    std::ostringstream o;
    o.precision(17);
    o << **d;
    return o.str();
  }
  if (auto* b = std::get_if<bool*>(&s)) return **b ? "1" : "0";
  if (auto* m = std::get_if<Mechanism*>(&s)) return mechanism_name(**m);
  if (auto* g = std::get_if<GateScale*>(&s)) return gate_scale_name(**g);
  return *std::get<std::string*>(s);
}

// Parses value into the slot; throws std::invalid_argument naming the key and what it expected.
void from_text(const Slot& s, const std::string& key, const std::string& v) {
  auto whole = [&](auto parse, const char* what) {
    size_t used = 0;
    decltype(parse(v, &used)) x{};
    try {
      x = parse(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (v.empty() || used != v.size()) throw std::invalid_argument(key + " expected " + what + ", got '" + v + "'");
    return x;
  };
  if (auto* i = std::get_if<int64_t*>(&s)) {
    **i = whole([](const std::string& t, size_t* u) { return static_cast<int64_t>(std::stoll(t, u)); }, "an integer");
  } else if (auto* d = std::get_if<double*>(&s)) {
    **d = whole([](const std::string& t, size_t* u) { return std::stod(t, u); }, "a number");
  } else if (auto* b = std::get_if<bool*>(&s)) {
    if (v != "0" && v != "1") throw std::invalid_argument(key + " expected 0 or 1, got '" + v + "'");
    **b = v == "1";
  } else if (auto* m = std::get_if<Mechanism*>(&s)) {
    **m = parse_mechanism(v);  // its message names the key and the choices
  } else if (auto* g = std::get_if<GateScale*>(&s)) {
    **g = parse_gate_scale(v);
  } else {
    *std::get<std::string*>(s) = v;
  }
}

}  // namespace

std::vector<KeyValue> parse_key_values(const std::string& text, const std::string& source) {
  std::vector<KeyValue> out;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const std::string where = source + " line " + std::to_string(n) + ": ";
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument(where + "expected key=value, got '" + line + "'");
    KeyValue kv{line.substr(0, eq), line.substr(eq + 1), n};
    if (!seen.insert(kv.key).second) throw std::invalid_argument(where + "key '" + kv.key + "' given twice");
    out.push_back(std::move(kv));
  }
  return out;
}

std::string key_value(const std::vector<KeyValue>& kv, const std::string& key, const std::string& source) {
  for (const auto& e : kv)
    if (e.key == key) return e.value;
  throw std::invalid_argument(source + ": missing key '" + key + "'");
}

std::string config_to_text(const ModelConfig& model, const TaskConfig& task) {
  ModelConfig m = model;  // the field lists take non-const pointers
  TaskConfig t = task;
  std::string out;
  for (const auto& [k, slot] : model_fields(m)) out += k + "=" + to_text(slot) + "\n";
  out += "task=" + t.name + "\n";
  for (const auto& [k, slot] : task_fields(t)) {
    const std::string v = to_text(slot);
    if (v.find_first_of("\r\n") != std::string::npos)
      throw std::invalid_argument("config: " + k + " holds a line break, which config.txt cannot record");
    out += k + "=" + v + "\n";
  }
  return out;
}

RunConfig config_from_text(const std::string& text, const std::string& source) {
  const auto kv = parse_key_values(text, source);
  auto where = [&](const KeyValue& e) { return source + " line " + std::to_string(e.line) + ": "; };
  RunConfig c;
  Fields fields = model_fields(c.model);
  // The task's name first: it decides which task options belong.
  auto task = std::find_if(kv.begin(), kv.end(), [](const KeyValue& e) { return e.key == "task"; });
  if (task != kv.end()) {
    c.task.name = task->value;
    try {
      for (auto& f : task_fields(c.task)) fields.push_back(f);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where(*task) + e.what());
    }
  }
  std::set<std::string> given;
  for (const auto& e : kv) {
    if (e.key == "task") continue;
    auto f = std::find_if(fields.begin(), fields.end(), [&](const auto& x) { return x.first == e.key; });
    if (f == fields.end()) throw std::invalid_argument(where(e) + "unknown key '" + e.key + "'");
    try {
      from_text(f->second, e.key, e.value);
    } catch (const std::invalid_argument& err) {
      throw std::invalid_argument(where(e) + err.what());
    }
    given.insert(e.key);
  }
  // Keys added after config.txt files were first recorded: absent in those, they keep their defaults (the
  // behaviour those runs had). Every other key must be there.
  static const std::set<std::string> kLater = {"a5.bos"};
  for (const auto& f : fields)  // the model's keys, then the task's options
    if (!given.count(f.first) && !kLater.count(f.first))
      throw std::invalid_argument(source + ": missing key '" + f.first + "'");
  if (task == kv.end()) throw std::invalid_argument(source + ": missing key 'task'");
  return c;
}

std::string config_diff(const ModelConfig& a, const ModelConfig& b) {
  ModelConfig ca = a, cb = b;
  const auto fa = model_fields(ca), fb = model_fields(cb);
  std::string out;
  for (size_t i = 0; i < fa.size(); ++i) {
    const std::string va = to_text(fa[i].second), vb = to_text(fb[i].second);
    if (va != vb) out += (out.empty() ? "" : ", ") + fa[i].first + ": " + va + " vs " + vb;
  }
  return out;
}

}  // namespace pathattn::model
