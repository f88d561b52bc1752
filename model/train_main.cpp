// pathattn_train: trains one model on one task (synthetic, or language modelling on shards) and writes metrics
// (see docs/model.md, docs/results/lm/README.md).
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "cli.h"
#include "task.h"
#include "trainer.h"

using namespace pathattn::model;

int main(int argc, char** argv) {
  CLI::App app{
      "Train a PaTH / RoPE / FoX transformer on a synthetic task (flip-flop, A5, MQRAR-N) or on tokenised text (lm)"};
  std::string mech = "path", device = "cpu";
  std::string precision = "auto";
  ModelConfig mc;
  TrainConfig tc;
  TaskConfig task_cfg;
  int threads = 0;
  // A repeated option takes its last value, so scripts can pass defaults and let the user override them.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--task", task_cfg.name, "flipflop | a5 | mqrar | lm")->capture_default_str();
  app.add_option("--mechanism", mech, "path | path-fox | rope | fox | nope")->capture_default_str();
  app.add_option("--layers", mc.n_layer, "number of blocks")->capture_default_str();
  app.add_option("--width", mc.d_model, "model width E")->capture_default_str();
  app.add_option("--heads", mc.n_head, "attention heads (head dim = width / heads)")->capture_default_str();
  app.add_option("--mlp", mc.mlp_hidden, "SwiGLU hidden size (0: 8/3 width)")->capture_default_str();
  app.add_flag("--qk-norm", mc.qk_norm, "per-head RMSNorm on q and k");
  app.add_option("--beta-max", mc.beta_max, "clamp beta to [0, beta-max] (0: no clamp)")->capture_default_str();
  std::string gate_scale = "none";
  app.add_option("--kv-heads", mc.n_kv_head, "key/value heads, GQA (0: --heads)")->capture_default_str();
  app.add_option("--gate-scale", gate_scale, "none (l = scale s + G_i - G_j) | fla (l = scale (s + G_i - G_j))")
      ->capture_default_str();
  app.add_option("--steps", tc.steps, "training steps")->capture_default_str();
  app.add_option("--batch", tc.batch, "sequences per step")->capture_default_str();
  app.add_option("--lr", tc.lr, "peak learning rate")->capture_default_str();
  app.add_option("--warmup", tc.warmup, "linear warm-up steps")->capture_default_str();
  app.add_option("--min-lr-ratio", tc.min_lr_ratio, "cosine floor as a fraction of lr")->capture_default_str();
  app.add_option("--weight-decay", tc.weight_decay, "AdamW weight decay")->capture_default_str();
  app.add_option("--beta2", tc.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--clip", tc.clip, "gradient norm clip (0: off)")->capture_default_str();
  app.add_option("--seed", tc.seed, "seed of the initialisation and the data stream")->capture_default_str();
  app.add_option("--eval-every", tc.eval_every, "evaluate every n steps")->capture_default_str();
  app.add_option("--eval-size", tc.eval_size, "sequences per evaluation set")->capture_default_str();
  app.add_option("--eval-batch", tc.eval_batch, "evaluation batch")->capture_default_str();
  app.add_option("--log-every", tc.log_every, "progress line every n steps")->capture_default_str();
  app.add_option("--ckpt-every", tc.ckpt_every, "checkpoint every n steps (0: at the end)")->capture_default_str();
  app.add_option("--stop-error", tc.stop_error, "stop once in-distribution error <= this (-1: never)")->capture_default_str();
  app.add_option("--stop-seq-error", tc.stop_seq_error,
                 "stop once the in-distribution sequence error (fraction of sequences with a wrong scored position) "
                 "<= this (-1: never; synthetic tasks)")
      ->capture_default_str();
  app.add_option("--out", tc.out_dir, "output folder: metrics.csv, metrics.json, ckpt/");
  app.add_flag("--resume", tc.resume, "resume from <out>/ckpt if present");
  app.add_option("--grad-accum", tc.grad_accum, "micro-batches of --batch sequences per optimizer step")
      ->capture_default_str();
  app.add_option("--stop-after", tc.stop_after, "stop this invocation after n steps, with a checkpoint (0: never)")
      ->capture_default_str();
  app.add_option("--time-limit", tc.time_limit_s,
                 "stop this invocation, with a checkpoint, at the first step ending past this many seconds (0: never)")
      ->capture_default_str();
  app.add_option("--init-from", tc.init_from,
                 "checkpoint folder to take the initial weights from by name (e.g. RoPE -> PaTH); ignored on resume");
  app.add_option("--device", device, "cpu | cuda")->capture_default_str();
  app.add_option("--precision", precision, "auto (bf16 on cuda, f32 on cpu) | f32 | bf16 (autocast over f32 parameters)")
      ->capture_default_str();
  app.add_option("--deterministic", tc.deterministic,
                 "PaTH's CUDA backward in its fixed summation order (true: the same gradient bits on every run) or its "
                 "faster atomic order (false); the flag does not change the CPU backward")
      ->capture_default_str();
  app.add_flag("--torch-deterministic", tc.torch_deterministic,
               "the rest of a CUDA step deterministic too (torch's deterministic algorithms, warn-only, and "
               "CUBLAS_WORKSPACE_CONFIG=:4096:8): with --deterministic true, a run repeats bit for bit");
  app.add_option("--threads", threads, "CPU threads (0: all hardware threads)")->capture_default_str();
  app.add_option("--ff-pairs", task_cfg.flipflop.pairs, "flip-flop: instruction-bit pairs per sequence")->capture_default_str();
  app.add_option("--ff-p-ignore", task_cfg.flipflop.p_ignore, "flip-flop: training p(ignore)")->capture_default_str();
  app.add_option("--a5-length", task_cfg.a5.length, "A5: sequence length")->capture_default_str();
  app.add_flag("--a5-bos", task_cfg.a5.bos, "A5: a beginning-of-sequence token first (Merrill et al.'s form; model/task.h)");
  app.add_option("--mqrar-n", task_cfg.mqrar.n_back, "MQRAR: N of N-back")->capture_default_str();
  app.add_option("--mqrar-length", task_cfg.mqrar.length, "MQRAR: tokens per sequence")->capture_default_str();
  app.add_option("--mqrar-keys", task_cfg.mqrar.keys, "MQRAR: number of keys")->capture_default_str();
  app.add_option("--mqrar-values", task_cfg.mqrar.values, "MQRAR: number of values")->capture_default_str();
  app.add_option("--mqrar-p-query", task_cfg.mqrar.p_query, "MQRAR: probability that a pair is a query")->capture_default_str();
  app.add_option("--lm-data", task_cfg.lm.data_dir, "lm: folder of train-*.tok and valid-*.tok shards (tools/lm_data.py)");
  app.add_option("--lm-seq-len", task_cfg.lm.seq_len, "lm: training length T (windows of T + 1 tokens)")
      ->capture_default_str();
  app.add_option("--lm-train-shards", task_cfg.lm.train_shards, "lm: use only the first n train shards (0: all present)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    set_threads(threads);
    tc.device = parse_device(device);
    tc.precision = parse_precision(precision, tc.device);
    mc.gate_scale = parse_gate_scale(gate_scale);
    auto task = make_task(task_cfg);
    mc.vocab = task->vocab();
    mc.mechanism = parse_mechanism(mech);

    torch::manual_seed(tc.seed);
    Transformer model(mc);
    const std::string label = task->name() + "/" + mech;
    std::cout << "[" << label << "] " << model->num_parameters() << " parameters, layers " << mc.n_layer
              << ", width " << mc.d_model << ", heads " << mc.n_head << ", T " << task->seq_len() << ", batch "
              << tc.batch << " x " << tc.grad_accum << " micro-batches, steps " << tc.steps << ", lr " << tc.lr
              << ", threads " << at::get_num_threads()
              << ", " << device << " " << precision_name(tc.precision) << std::endl;
    auto r = train(model, *task, tc, label);

    std::cout << "[" << label << "] " << (r.stopped_early ? "stopped: " : "done: ") << r.steps_done << " steps in "
              << r.seconds << " s";
    for (const auto& [k, v] : r.final_eval.error) std::cout << "  " << k << " error " << 100 * v << "%";
    std::cout << std::endl;
    if (!tc.out_dir.empty()) {
      std::ofstream js(std::filesystem::path(tc.out_dir) / "metrics.json");
      js << "{\n  \"task\": \"" << task->name() << "\",\n  \"mechanism\": \"" << mech << "\",\n"
         << "  \"layers\": " << mc.n_layer << ", \"width\": " << mc.d_model << ", \"heads\": " << mc.n_head
         << ", \"parameters\": " << model->num_parameters() << ",\n"
         << "  \"seq_len\": " << task->seq_len() << ", \"batch\": " << tc.batch << ", \"steps\": " << tc.steps
         << ", \"steps_done\": " << r.steps_done << ", \"complete\": " << (r.steps_done == tc.steps ? "true" : "false")
         << ",\n  \"stop_reason\": \"" << r.stop_reason << "\", \"finished\": "
         << (r.stop_reason == "steps" || r.stop_reason == "stop_error" || r.stop_reason == "stop_seq_error" ? "true"
                                                                                                           : "false")
         << ", \"stop_error\": " << json_num(tc.stop_error) << ", \"stop_seq_error\": " << json_num(tc.stop_seq_error)
         << ", \"lr\": " << tc.lr << ", \"seed\": " << tc.seed << ",\n"
         << "  \"grad_accum\": " << tc.grad_accum << ", \"tokens_per_step\": " << r.tokens_per_step
         << ", \"tokens_seen\": " << r.tokens_per_step * r.steps_done << ",\n"
         << "  \"data\": \"" << task->data_state() << "\", \"init_from\": \"" << tc.init_from << "\",\n"
         << "  \"threads\": " << at::get_num_threads() << ", \"device\": \""
         << device << "\", \"precision\": \"" << precision_name(tc.precision)
         << "\", \"deterministic\": " << (tc.deterministic ? "true" : "false")
         << ", \"torch_deterministic\": " << (tc.torch_deterministic ? "true" : "false") << ",\n  \"train_seconds\": "
         << r.seconds << ", \"final_train_loss\": "
         << json_num(r.final_train_loss) << ",\n  \"error\": {";
      bool first = true;
      for (const auto& [k, v] : r.final_eval.error) {
        js << (first ? "" : ", ") << "\"" << k << "\": " << json_num(v);
        first = false;
      }
      js << "},\n  \"loss\": {";
      first = true;
      for (const auto& [k, v] : r.final_eval.loss) {
        js << (first ? "" : ", ") << "\"" << k << "\": " << json_num(v);
        first = false;
      }
      if (!task->language_model()) {
        js << "},\n  \"sequence_error\": {";
        first = true;
        for (const auto& [k, v] : r.final_eval.seq_error) {
          js << (first ? "" : ", ") << "\"" << k << "\": " << json_num(v);
          first = false;
        }
      }
      if (task->language_model()) {
        js << "},\n  \"perplexity\": {";
        first = true;
        for (const auto& [k, v] : r.final_eval.loss) {
          js << (first ? "" : ", ") << "\"" << k << "\": " << json_num(std::exp(v));
          first = false;
        }
      }
      js << "},\n  \"position_accuracy\": [";
      for (size_t i = 0; i < r.final_eval.pos_accuracy.size(); ++i)
        js << (i ? ", " : "") << json_num(r.final_eval.pos_accuracy[i]);
      js << "]";
      if (!task->language_model()) {
        js << ",\n  \"prefix_sequence_accuracy\": [";
        for (size_t i = 0; i < r.final_eval.prefix_seq_accuracy.size(); ++i)
          js << (i ? ", " : "") << json_num(r.final_eval.prefix_seq_accuracy[i]);
        js << "]";
      }
      js << "\n}\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "pathattn_train: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
