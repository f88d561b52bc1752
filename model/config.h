// Model configuration: one decoder-only transformer, five position mechanisms sharing all other code.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "pathattn/pathattn.h"  // cuda_head_dim_supported

namespace pathattn::model {

enum class Mechanism { path, path_fox, rope, fox, nope };

inline const char* mechanism_name(Mechanism m) {
  switch (m) {
    case Mechanism::path: return "path";
    case Mechanism::path_fox: return "path-fox";
    case Mechanism::rope: return "rope";
    case Mechanism::fox: return "fox";
    case Mechanism::nope: return "nope";
  }
  return "?";
}

inline Mechanism parse_mechanism(const std::string& s) {
  if (s == "path") return Mechanism::path;
  if (s == "path-fox") return Mechanism::path_fox;
  if (s == "rope") return Mechanism::rope;
  if (s == "fox") return Mechanism::fox;
  if (s == "nope") return Mechanism::nope;
  throw std::invalid_argument("mechanism: expected path, path-fox, rope, fox or nope, got '" + s + "'");
}

inline bool uses_path(Mechanism m) { return m == Mechanism::path || m == Mechanism::path_fox; }
inline bool uses_gate(Mechanism m) { return m == Mechanism::path_fox || m == Mechanism::fox; }

// How the forget gate enters the logits (the layer option gate_scale, same name and values in Python's
// PaTHAttention). none (ours, the default): l_ij = scale s_ij + G_i - G_j. fla: l_ij = scale (s_ij + G_i - G_j),
// fla's PaTH-FoX convention (its layer scales the gate by D^-1/2), so fla checkpoints run unchanged.
enum class GateScale { none, fla };

inline const char* gate_scale_name(GateScale s) { return s == GateScale::fla ? "fla" : "none"; }

inline GateScale parse_gate_scale(const std::string& s) {
  if (s == "none") return GateScale::none;
  if (s == "fla") return GateScale::fla;
  throw std::invalid_argument("gate_scale: expected none or fla, got '" + s + "'");
}

// Checkpoints record every field (config.txt): a new field goes into model/config_io.cpp's field list too.
struct ModelConfig {
  int64_t vocab = 0;
  int64_t n_layer = 1;
  int64_t d_model = 64;
  int64_t n_head = 2;     // query heads
  int64_t n_kv_head = 0;  // key/value heads (GQA: n_head a multiple of it); 0: n_head
  int64_t mlp_hidden = 0; // SwiGLU hidden size; 0: 8/3 d_model rounded up to a multiple of 8
  Mechanism mechanism = Mechanism::path;
  bool qk_norm = false;
  double beta_max = 0.0;  // > 0: clamp beta to [0, beta_max] (guards bf16 runs)
  int64_t w_rank = 32;    // low rank of the w projection (docs/spec.md §5)
  bool low_rank_w = true;   // fla's use_low_rank_w: w_proj = Linear(E, w_rank), Linear(w_rank, H*D); else one Linear
  bool w_shortconv = true;  // fla's use_w_shortconv: causal depthwise conv + SiLU on w before the L2 norm
  int64_t conv_size = 3;    // taps of that conv
  GateScale gate_scale = GateScale::none;
  double rope_base = 10000.0;

  int64_t head_dim() const { return d_model / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t mlp_size() const { return mlp_hidden > 0 ? mlp_hidden : ((8 * d_model / 3 + 7) / 8) * 8; }
  void validate() const {
    if (vocab <= 0) throw std::invalid_argument("vocab: expected > 0, got " + std::to_string(vocab));
    if (n_layer <= 0) throw std::invalid_argument("n_layer: expected > 0, got " + std::to_string(n_layer));
    if (n_head <= 0 || d_model % n_head != 0)
      throw std::invalid_argument("d_model (" + std::to_string(d_model) + ") must be a multiple of n_head (" +
                                  std::to_string(n_head) + ")");
    if (kv_heads() <= 0 || n_head % kv_heads() != 0)
      throw std::invalid_argument("n_head (" + std::to_string(n_head) + ") must be a multiple of n_kv_head (" +
                                  std::to_string(kv_heads()) + ")");
    if (conv_size < 1) throw std::invalid_argument("conv_size: expected >= 1, got " + std::to_string(conv_size));
    if (mechanism == Mechanism::rope && head_dim() % 2 != 0)
      throw std::invalid_argument("rope needs an even head dimension, got " + std::to_string(head_dim()));
  }
  // On a CUDA device PaTH runs on the CUDA kernels, which take head dimensions 64 and 128 only (the core's
  // cuda_head_dim_supported, the rule of its supports()):
  // checked where a model meets the device (train, load_checkpoint), so that the error names the model's sizes
  // rather than surfacing from the op at the first step.
  void validate_on_cuda() const {
    const bool path = mechanism == Mechanism::path || mechanism == Mechanism::path_fox;
    const int64_t hd = head_dim();
    if (path && !cuda_head_dim_supported(hd))
      throw std::invalid_argument(
          std::string(mechanism_name(mechanism)) +
          " on cuda: the CUDA kernels take a head dimension (width / heads) of 64 or 128, got width " +
          std::to_string(d_model) + " / " + std::to_string(n_head) + " heads = " + std::to_string(hd) +
          " (e.g. width " + std::to_string(64 * n_head) + "; or --device cpu)");
  }
};

}  // namespace pathattn::model
