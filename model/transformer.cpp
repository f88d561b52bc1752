#include "transformer.h"

namespace pathattn::model {

namespace {
torch::nn::Linear make_linear(torch::nn::Module& m, const char* name, int64_t in, int64_t out) {
  auto l = m.register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
  torch::nn::init::normal_(l->weight, 0.0, 0.02);
  return l;
}
}  // namespace

SwiGLUImpl::SwiGLUImpl(int64_t d_model, int64_t hidden) {
  gate = make_linear(*this, "gate", d_model, hidden);
  up = make_linear(*this, "up", d_model, hidden);
  down = make_linear(*this, "down", hidden, d_model);
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) { return down(torch::silu(gate(x)) * up(x)); }

BlockImpl::BlockImpl(const ModelConfig& cfg) {
  norm1 = register_module("norm1", RMSNorm(cfg.d_model));
  attn = register_module("attn", Attention(cfg));
  norm2 = register_module("norm2", RMSNorm(cfg.d_model));
  mlp = register_module("mlp", SwiGLU(cfg.d_model, cfg.mlp_size()));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, LayerCache* cache, bool commit) {
  auto h = x + attn(norm1(x), cache, commit);
  return h + mlp(norm2(h));
}

TransformerImpl::TransformerImpl(const ModelConfig& cfg) : cfg_(cfg) {
  cfg.validate();
  embed = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.d_model));
  torch::nn::init::normal_(embed->weight, 0.0, 0.02);
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    blocks.push_back(register_module("block" + std::to_string(l), Block(cfg)));
  }
  norm = register_module("norm", RMSNorm(cfg.d_model));
  head = make_linear(*this, "head", cfg.d_model, cfg.vocab);
}

int64_t TransformerImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

void TransformerImpl::set_path_run_options(const PathRunOptions& o) {
  for (auto& b : blocks) b->attention().set_path_run_options(o);
}

PathRunOptions TransformerImpl::path_run_options() const {
  return blocks.empty() ? PathRunOptions{} : blocks.front()->attention().path_run_options();
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& tokens, KVCache* cache, bool commit) {
  if (tokens.dim() != 2) throw std::invalid_argument("tokens: expected [B, T] int64");
  if (!commit && (cache == nullptr || cache->empty()))
    throw std::invalid_argument("commit = false needs a cache that holds a prompt (the prefill commits)");
  if (cache && cache->empty()) cache->resize(blocks.size());
  auto x = embed(tokens);  // [B, T, E]
  for (size_t l = 0; l < blocks.size(); ++l) x = blocks[l](x, cache ? &(*cache)[l] : nullptr, commit);
  auto logits = head(norm(x));  // [B, T, V]
  return logits.scalar_type() == torch::kDouble ? logits : logits.to(torch::kFloat);
}

}  // namespace pathattn::model
