// layer_io IN OUT: the C++ PaTH layer (model/attention.h) on weights and inputs written by Python, for
// tests/python/test_cross_language.py. IN (torch.save of a dict): "config" (hidden_size, num_heads, num_kv_heads,
// use_forget_gate, use_qk_norm, use_low_rank_w, use_w_shortconv, conv_size, w_rank, gate_scale: the Python layer's
// constructor arguments), "state" (the Python layer's state_dict), "x" [B, T, E] f32, "prefill" P, "step" S.
// The state is loaded strictly: every key must be a parameter of the C++ layer and every parameter must be given.
// OUT (torch.load-able): "keys" (the C++ layer's parameter names), "full" (forward of x), "prefill" (forward of
// x[:, :P] into a cache), "step1" (one decoded token), "steps" (the next S tokens in one call).
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <set>

#include "attention.h"

using namespace pathattn::model;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: layer_io IN.pt OUT.pt\n";
    return 2;
  }
  try {
    std::ifstream in(argv[1], std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto root = torch::pickle_load(bytes).toGenericDict();
    auto cfgd = root.at("config").toGenericDict();
    auto get = [&](const char* k) { return cfgd.at(k); };
    ModelConfig c;
    c.vocab = 1;
    c.d_model = get("hidden_size").toInt();
    c.n_head = get("num_heads").toInt();
    c.n_kv_head = get("num_kv_heads").isNone() ? 0 : get("num_kv_heads").toInt();
    c.mechanism = get("use_forget_gate").toBool() ? Mechanism::path_fox : Mechanism::path;
    c.qk_norm = get("use_qk_norm").toBool();
    c.low_rank_w = get("use_low_rank_w").toBool();
    c.w_shortconv = get("use_w_shortconv").toBool();
    c.conv_size = get("conv_size").toInt();
    c.w_rank = get("w_rank").toInt();
    c.gate_scale = parse_gate_scale(get("gate_scale").toStringRef());
    c.validate();
    Attention layer(c);

    auto state = root.at("state").toGenericDict();
    std::set<std::string> given;
    for (const auto& e : state) given.insert(e.key().toStringRef());
    torch::NoGradGuard ng;
    auto out_keys = c10::impl::GenericList(c10::StringType::get());
    for (auto& p : layer->named_parameters()) {
      out_keys.push_back(p.key());
      if (!given.erase(p.key())) throw std::runtime_error("missing key in the Python state_dict: " + p.key());
      auto t = state.at(p.key()).toTensor();
      if (t.sizes() != p.value().sizes())
        throw std::runtime_error("shape of " + p.key() + ": C++ " + c10::str(p.value().sizes()) + ", Python " +
                                 c10::str(t.sizes()));
      p.value().copy_(t);
    }
    for (const auto& k : given) throw std::runtime_error("unexpected key in the Python state_dict: " + k);

    auto x = root.at("x").toTensor();
    const int64_t P = root.at("prefill").toInt(), S = root.at("step").toInt();
    LayerCache cache;
    auto out = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
    out.insert("keys", out_keys);
    out.insert("full", layer->forward(x));
    out.insert("prefill", layer->forward(x.narrow(1, 0, P), &cache));
    out.insert("step1", layer->forward(x.narrow(1, P, 1), &cache));
    out.insert("steps", layer->forward(x.narrow(1, P + 1, S), &cache));
    auto data = torch::pickle_save(out);
    std::ofstream(argv[2], std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "layer_io: " << e.what() << std::endl;
    return 1;
  }
}
