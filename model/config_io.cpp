#include "config_io.h"

#include <map>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace pathattn::model {

namespace {

// Every field of ModelConfig, in one place (keep it in step with config.h: a field missing here would not be saved,
// and a checkpoint would rebuild the model with its default).
std::vector<std::pair<std::string, std::string>> fields(const ModelConfig& c) {
  auto num = [](double x) {
    std::ostringstream s;
    s.precision(17);
    s << x;
    return s.str();
  };
  return {{"vocab", std::to_string(c.vocab)},
          {"n_layer", std::to_string(c.n_layer)},
          {"d_model", std::to_string(c.d_model)},
          {"n_head", std::to_string(c.n_head)},
          {"n_kv_head", std::to_string(c.n_kv_head)},
          {"mlp_hidden", std::to_string(c.mlp_hidden)},
          {"mechanism", mechanism_name(c.mechanism)},
          {"qk_norm", c.qk_norm ? "1" : "0"},
          {"beta_max", num(c.beta_max)},
          {"w_rank", std::to_string(c.w_rank)},
          {"low_rank_w", c.low_rank_w ? "1" : "0"},
          {"w_shortconv", c.w_shortconv ? "1" : "0"},
          {"conv_size", std::to_string(c.conv_size)},
          {"gate_scale", gate_scale_name(c.gate_scale)},
          {"rope_base", num(c.rope_base)}};
}

}  // namespace

std::string config_to_text(const ModelConfig& c) {
  std::string out;
  for (const auto& [k, v] : fields(c)) out += k + "=" + v + "\n";
  return out;
}

ModelConfig config_from_text(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("model config: expected key=value, got '" + line + "'");
    kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  auto take = [&](const std::string& k) {
    auto it = kv.find(k);
    if (it == kv.end()) throw std::invalid_argument("model config: missing key '" + k + "'");
    std::string v = it->second;
    kv.erase(it);
    return v;
  };
  auto integer = [&](const std::string& k) {
    const std::string v = take(k);
    size_t used = 0;
    int64_t x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || v.empty())
      throw std::invalid_argument("model config: " + k + " expected an integer, got '" + v + "'");
    return x;
  };
  auto real = [&](const std::string& k) {
    const std::string v = take(k);
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || v.empty())
      throw std::invalid_argument("model config: " + k + " expected a number, got '" + v + "'");
    return x;
  };
  auto flag = [&](const std::string& k) {
    const std::string v = take(k);
    if (v != "0" && v != "1") throw std::invalid_argument("model config: " + k + " expected 0 or 1, got '" + v + "'");
    return v == "1";
  };
  ModelConfig c;
  c.vocab = integer("vocab");
  c.n_layer = integer("n_layer");
  c.d_model = integer("d_model");
  c.n_head = integer("n_head");
  c.n_kv_head = integer("n_kv_head");
  c.mlp_hidden = integer("mlp_hidden");
  c.mechanism = parse_mechanism(take("mechanism"));
  c.qk_norm = flag("qk_norm");
  c.beta_max = real("beta_max");
  c.w_rank = integer("w_rank");
  c.low_rank_w = flag("low_rank_w");
  c.w_shortconv = flag("w_shortconv");
  c.conv_size = integer("conv_size");
  c.gate_scale = parse_gate_scale(take("gate_scale"));
  c.rope_base = real("rope_base");
  if (!kv.empty()) throw std::invalid_argument("model config: unknown key '" + kv.begin()->first + "'");
  return c;
}

std::string config_diff(const ModelConfig& a, const ModelConfig& b) {
  const auto fa = fields(a), fb = fields(b);
  std::string out;
  for (size_t i = 0; i < fa.size(); ++i) {
    if (fa[i].second != fb[i].second)
      out += (out.empty() ? "" : ", ") + fa[i].first + ": " + fa[i].second + " vs " + fb[i].second;
  }
  return out;
}

}  // namespace pathattn::model
