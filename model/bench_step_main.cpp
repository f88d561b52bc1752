// bench_step: the time of one training step of the transformer (the trainer's train_step: forward + masked loss
// under the run's precision, backward, gradient clipping, AdamW) per mechanism, on random tokens, in one run.
// Everything but the mechanism is identical between rows: width, depth, heads, vocab, T, batch, precision, data,
// optimizer. The mechanisms' steps are interleaved (step i of every mechanism before step i + 1) so that clock or
// thermal drift during the run hits all of them alike. Prints a table; --csv writes it too.
//
//   bench_step                          # GPU default: path, path:fast, path:sdpa, path:repro, path-fox, rope,
//                                       # rope:composed;
//                                       # width 768, 12 layers, 12 heads (D 64), vocab 8192 (about 98M
//                                       # parameters), T 4096, batch 8, bf16
//   bench_step --device cpu --width 64 --layers 2 --heads 2 --T 128 --batch 2 --steps 2   # the CPU smoke test
//   bench_step ... --data-task mqrar --T 767     # also times drawing one batch of the task's training data (on the
//                                                # host, then moved to the device): a row "data:mqrar"
//
// A mechanism named with ":fast" (path:fast, path-fox:fast) runs PaTH's CUDA backward in its fast, atomic order
// (TrainConfig::deterministic = false, the op's deterministic = false); the plain name is the default fixed order.
// "rope" rotates through the fused op (PathRunOptions::fused_rope, the model's default), "rope:composed" through the
// composition of ATen operators that the rows before 2026-12-06 used (the same bits, ~20 passes each way). ":sdpa" (path:sdpa, path-fox:sdpa) is for timing only: the PaTH layers with the op replaced by SDPA on the same
// q, k, v (PathRunOptions::sdpa_for_timing, model/attention.h), so that path - path:sdpa is what the op costs in a
// step and path:sdpa - rope what the rest of the PaTH layer (w projection, short convolution, norms, beta) costs
// beyond RoPE's rotation. ":repro" (any mechanism: path:repro, rope:repro) times the step under the trainer's
// --torch-deterministic (TorchDeterminismGuard around that row's steps): what a bit-reproducible run costs.
//
// --data-task flipflop|a5|mqrar: the task with its default options except the length, which --T sets (a5 length T,
// flip-flop (T + 1) / 2 pairs, MQRAR length T + 1), drawn as the trainer draws it (draw_batch, --batch sequences);
// tools/sweep_synthetic.py uses it for the host's share of a training step.
//
// --ops N: after the timed steps, one more step per mechanism under OpCount (op_count.h): the ATen operators the step
// runs that launch work (leaves, views left out), in all and the N most frequent by name. A launch-bound step (the
// synthetic tasks' small models) costs about its count times the time of one launch.
//
// No CLI11 here (the GPU image may not have it): options are --name value pairs.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "op_count.h"
#include "trainer.h"

using namespace pathattn::model;

namespace {

struct Options {
  std::string mechanisms = "path,path:fast,path:sdpa,path:repro,path-fox,rope,rope:composed";
  int64_t width = 768, layers = 12, heads = 12, mlp = 0, vocab = 8192, T = 4096, batch = 8;
  int64_t warmup = 3, steps = 10, threads = 0, seed = 1, ops = 0;
  double lr = 3e-4;
  std::string device = "auto", precision = "auto", csv, data_task;
  std::string optim = "foreach";  // the trainer's optimizer step: foreach (optim_step.h) or loop (torch's)
};

// --name value pairs into opt; false (with a message) on an unknown name, a missing value or --help.
bool parse(int argc, char** argv, Options& o) {
  std::map<std::string, std::function<void(const std::string&)>> set{
      {"--mechanisms", [&](const std::string& v) { o.mechanisms = v; }},
      {"--width", [&](const std::string& v) { o.width = std::stoll(v); }},
      {"--layers", [&](const std::string& v) { o.layers = std::stoll(v); }},
      {"--heads", [&](const std::string& v) { o.heads = std::stoll(v); }},
      {"--mlp", [&](const std::string& v) { o.mlp = std::stoll(v); }},
      {"--vocab", [&](const std::string& v) { o.vocab = std::stoll(v); }},
      {"--T", [&](const std::string& v) { o.T = std::stoll(v); }},
      {"--batch", [&](const std::string& v) { o.batch = std::stoll(v); }},
      {"--warmup", [&](const std::string& v) { o.warmup = std::stoll(v); }},
      {"--steps", [&](const std::string& v) { o.steps = std::stoll(v); }},
      {"--threads", [&](const std::string& v) { o.threads = std::stoll(v); }},
      {"--seed", [&](const std::string& v) { o.seed = std::stoll(v); }},
      {"--lr", [&](const std::string& v) { o.lr = std::stod(v); }},
      {"--device", [&](const std::string& v) { o.device = v; }},
      {"--precision", [&](const std::string& v) { o.precision = v; }},
      {"--csv", [&](const std::string& v) { o.csv = v; }},
      {"--data-task", [&](const std::string& v) { o.data_task = v; }},
      {"--optim", [&](const std::string& v) { o.optim = v; }},
      {"--ops", [&](const std::string& v) { o.ops = std::stoll(v); }},
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    auto it = set.find(name);
    if (it == set.end() || i + 1 >= argc) {
      if (name != "--help") std::cerr << "bench_step: unknown option or missing value: " << name << "\n";
      std::cerr << "options (--name value):";
      for (const auto& [n, f] : set) std::cerr << " " << n;
      std::cerr << "\n  --mechanisms: comma list of path, path-fox, rope, fox, nope (path and path-fox also with "
                   ":fast, the fast backward, or :sdpa, SDPA in place of the op, for timing; rope:composed, the "
                   "rotation composed of ATen operators instead of the fused one; any with :repro, the trainer's --torch-deterministic); --device auto|cpu|cuda; "
                   "--precision auto|f32|bf16; --mlp 0: 8/3 width; --data-task flipflop|a5|mqrar; --optim "
                   "foreach|loop (the optimizer step on foreach kernels, the trainer's, or torch's per-tensor one); --ops N: the "
                   "operators of one more step per mechanism, the N most frequent by name\n";
      return false;
    }
    try {
      it->second(argv[i + 1]);
    } catch (const std::logic_error&) {  // std::stoll / std::stod: not a number, or out of range
      throw std::invalid_argument(name + ": expected a number, got '" + argv[i + 1] + "'");
    }
  }
  return true;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One mechanism's model, optimizer and timings.
struct Run {
  std::string name;
  int64_t params = 0;
  Transformer model{nullptr};
  std::unique_ptr<torch::optim::AdamW> opt;
  bool repro = false;      // the :repro mode: steps under TorchDeterminismGuard
  std::vector<double> ms;  // timed steps
  double loss = NAN;       // after the last step
  std::string error;       // set when a step threw; the run is dropped from then on
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    if (!parse(argc, argv, o)) return 1;
    at::set_num_threads(o.threads > 0 ? static_cast<int>(o.threads)
                                      : static_cast<int>(std::thread::hardware_concurrency()));
    if (o.device == "auto") o.device = torch::cuda::is_available() ? "cuda" : "cpu";
    if (o.device != "cpu" && o.device != "cuda")
      throw std::invalid_argument("--device: expected auto, cpu or cuda, got '" + o.device + "'");
    if (o.device == "cuda" && !torch::cuda::is_available())
      throw std::invalid_argument("--device cuda: no CUDA device available");
    const torch::Device dev = o.device == "cuda" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
    if (o.optim != "foreach" && o.optim != "loop")
      throw std::invalid_argument("--optim: expected foreach or loop, got '" + o.optim + "'");
    TrainConfig tc;  // the trainer's defaults (AdamW betas, weight decay 0.1, clip 1.0) at a fixed learning rate
    tc.lr = o.lr;
    tc.foreach_step = o.optim == "foreach";
    tc.batch = o.batch;
    tc.device = dev;
    tc.precision = parse_precision(o.precision, dev);
    auto sync = [&] {
      if (dev.is_cuda()) torch::cuda::synchronize();
    };

    // One batch of random tokens, drawn once on the CPU and kept on the device: every mechanism and step sees it.
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed));
    auto tokens = torch::randint(o.vocab, {o.batch, o.T + 1}, gen, torch::kLong);  // [B, T + 1]
    const Batch batch{tokens.narrow(1, 0, o.T).contiguous().to(dev), tokens.narrow(1, 1, o.T).contiguous().to(dev),
                      torch::ones({o.batch, o.T}, torch::kBool).to(dev)};

    std::vector<Run> runs;
    for (const auto& entry : split(o.mechanisms)) {
      const size_t colon = entry.find(':');
      const std::string m = entry.substr(0, colon), mode = colon == std::string::npos ? "" : entry.substr(colon + 1);
      const bool path_mode = mode == "fast" || mode == "sdpa";
      const bool rope_mode = mode == "composed" && parse_mechanism(m) == Mechanism::rope;
      if (!mode.empty() && mode != "repro" && !rope_mode && !(path_mode && uses_path(parse_mechanism(m))))
        throw std::invalid_argument("--mechanisms: '" + entry +
                                    "': modes are ':repro' (any mechanism), ':fast', ':sdpa' (path, path-fox) and "
                                    "':composed' (rope)");
      ModelConfig mc;
      mc.vocab = o.vocab;
      mc.n_layer = o.layers;
      mc.d_model = o.width;
      mc.n_head = o.heads;
      mc.mlp_hidden = o.mlp;
      mc.mechanism = parse_mechanism(m);
      torch::manual_seed(static_cast<uint64_t>(o.seed));
      Run r;
      r.name = entry;
      r.repro = mode == "repro";
      r.model = Transformer(mc);
      PathRunOptions run;
      run.deterministic_backward = mode != "fast";
      run.sdpa_for_timing = mode == "sdpa";
      run.fused_rope = !rope_mode;
      r.model->set_path_run_options(run);
      r.params = r.model->num_parameters();
      r.model->to(dev);
      r.model->train();
      r.opt = std::make_unique<torch::optim::AdamW>(r.model->parameters(), adamw_options(tc));
      runs.push_back(std::move(r));
    }
    const ModelConfig shape = runs.empty() ? ModelConfig{} : runs.front().model->config();
    std::printf("# bench_step: one training step (forward + loss, backward, clip, AdamW) on random tokens\n");
    std::printf("# B %ld x T %ld, width %ld, layers %ld, heads %ld (D %ld), SwiGLU %ld, vocab %ld; %s, %s,"
                " threads %d\n",
                (long)o.batch, (long)o.T, (long)o.width, (long)o.layers, (long)o.heads, (long)shape.head_dim(),
                (long)shape.mlp_size(), (long)o.vocab, o.device.c_str(), precision_name(tc.precision), at::get_num_threads());
    std::printf("# %ld warm-up + %ld timed steps per mechanism, interleaved; step time = median; optimizer step: %s\n",
                (long)o.warmup, (long)o.steps, o.optim.c_str());
    std::fflush(stdout);

    for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
      for (auto& r : runs) {
        if (!r.error.empty()) continue;
        try {
          const TorchDeterminismGuard determinism(r.repro);
          sync();
          const auto t0 = std::chrono::steady_clock::now();
          auto loss = train_step(r.model, *r.opt, batch, tc);
          sync();
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          if (i >= o.warmup) r.ms.push_back(ms);
          r.loss = loss.item<double>();
        } catch (const std::exception& e) {
          std::string msg = e.what();
          r.error = msg.substr(0, msg.find('\n'));  // c10::Error appends a backtrace; its first line says what
          r.opt.reset();
          r.model = Transformer(nullptr);  // frees its memory for the others
          std::fprintf(stderr, "bench_step: %s failed at step %ld: %s\n", r.name.c_str(), (long)i, msg.c_str());
        }
      }
    }

    double rope_ms = NAN;
    for (const auto& r : runs)
      if (r.name == "rope" && r.error.empty() && !r.ms.empty()) rope_ms = median(r.ms);
    std::ofstream csv;
    if (!o.csv.empty()) {
      csv.open(o.csv);
      csv << "mechanism,params,batch,T,step_ms_median,step_ms_min,tokens_per_s,ratio_to_rope,loss,error\n";
    }
    std::printf("%-14s %9s %12s %10s %12s %8s %8s\n", "mechanism", "params_M", "step_ms_med", "step_ms_min",
                "tokens/s", "x_rope", "loss");
    bool failed = false;
    for (const auto& r : runs) {
      if (!r.error.empty() || r.ms.empty()) {
        failed = true;
        std::printf("%-14s %9.2f  failed: %s\n", r.name.c_str(), r.params / 1e6, r.error.c_str());
        if (csv.is_open()) csv << r.name << "," << r.params << "," << o.batch << "," << o.T << ",,,,,,\"" << r.error << "\"\n";
        continue;
      }
      const double med = median(r.ms), mn = *std::min_element(r.ms.begin(), r.ms.end());
      const double tok_s = o.batch * o.T / (med / 1e3), ratio = med / rope_ms;
      std::printf("%-14s %9.2f %12.2f %10.2f %12.0f %8.3f %8.4f\n", r.name.c_str(), r.params / 1e6, med, mn, tok_s,
                  ratio, r.loss);
      if (csv.is_open())
        csv << r.name << "," << r.params << "," << o.batch << "," << o.T << "," << med << "," << mn << "," << tok_s
            << "," << ratio << "," << r.loss << ",\n";
    }
    if (o.ops < 0) throw std::invalid_argument("--ops: expected N >= 0, got " + std::to_string(o.ops));
    if (o.ops > 0) {
      std::printf("\n# operators of one step that launch work (ATen leaves; views and metadata left out)\n");
      for (auto& r : runs) {
        if (!r.error.empty()) continue;
        const TorchDeterminismGuard determinism(r.repro);
        OpCount count;
        train_step(r.model, *r.opt, batch, tc);
        sync();
        count.stop();
        auto by_name = count.launching();
        std::vector<std::pair<int64_t, std::string>> top;
        for (const auto& [name, n] : by_name) top.emplace_back(n, name);
        std::sort(top.rbegin(), top.rend());
        // The whole step's (embedding, head, loss, clipping and AdamW too): runs at two depths give a layer's.
        std::printf("%-14s %6ld launching, %6ld metadata:", r.name.c_str(), (long)count.launching_total(),
                    (long)count.metadata_total());
        for (size_t i = 0; i < top.size() && i < static_cast<size_t>(o.ops); ++i)
          std::printf(" %s %ld%s", top[i].second.c_str(), (long)top[i].first, i + 1 < top.size() ? "," : "");
        std::printf("\n");
      }
    }
    if (!o.data_task.empty()) {
      // The task at this T (see the header); refused when T is not one of its lengths.
      TaskConfig task_cfg;
      task_cfg.name = o.data_task;
      if (o.data_task == "a5") task_cfg.a5.length = o.T;
      else if (o.data_task == "flipflop") task_cfg.flipflop.pairs = (o.T + 1) / 2;
      else if (o.data_task == "mqrar") task_cfg.mqrar.length = o.T + 1;
      else throw std::invalid_argument("--data-task: expected flipflop, a5 or mqrar, got '" + o.data_task + "'");
      auto task = make_task(task_cfg);
      if (task->seq_len() != o.T)
        throw std::invalid_argument("--T: " + o.data_task + " has no length " + std::to_string(o.T) +
                                    " (nearest: " + std::to_string(task->seq_len()) + ")");
      std::vector<double> ms;
      for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
        sync();
        const auto t0 = std::chrono::steady_clock::now();
        auto b = draw_batch(*task, tc, i);
        auto on_dev = std::vector<torch::Tensor>{b.input.to(dev), b.target.to(dev), b.mask.to(dev)};
        sync();
        const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (i >= o.warmup) ms.push_back(t);
      }
      if (ms.empty()) throw std::invalid_argument("--steps: expected >= 1 with --data-task, got 0");
      const double med = median(ms), mn = *std::min_element(ms.begin(), ms.end());
      const std::string name = "data:" + o.data_task;
      std::printf("%-14s %9s %12.2f %10.2f %12.0f\n", name.c_str(), "-", med, mn, o.batch * o.T / (med / 1e3));
      if (csv.is_open())
        csv << name << ",0," << o.batch << "," << o.T << "," << med << "," << mn << "," << o.batch * o.T / (med / 1e3)
            << ",,,\n";
    }
    return failed ? 2 : 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_step: " << e.what() << std::endl;
    return 1;
  }
}
