#include "trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "checkpoint.h"

namespace pathattn::model {

namespace fs = std::filesystem;

double lr_at(const TrainConfig& cfg, int64_t step) {
  if (cfg.warmup > 0 && step < cfg.warmup) return cfg.lr * (step + 1) / cfg.warmup;
  const double span = std::max<int64_t>(1, cfg.steps - cfg.warmup);
  const double progress = std::min(1.0, (step - cfg.warmup) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine);
}

torch::Tensor masked_loss(const torch::Tensor& logits, const Batch& b) {
  auto sel = logits.index({b.mask});  // [M, V]
  return torch::nn::functional::cross_entropy(sel, b.target.index({b.mask}));
}

namespace {

Batch to_device(const Batch& b, torch::Device dev) {
  return {b.input.to(dev), b.target.to(dev), b.mask.to(dev)};
}

Batch slice(const Batch& b, int64_t start, int64_t len) {
  return {b.input.narrow(0, start, len), b.target.narrow(0, start, len), b.mask.narrow(0, start, len)};
}

std::string fmt_seconds(double s) {
  char buf[32];
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", (long)(t / 3600), (long)(t % 3600 / 60));
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", (long)(t / 60), (long)(t % 60));
  return buf;
}

// Per-step data stream: batch s is drawn from its own seed, so a resumed run sees the same batches.
Batch draw_batch(const Task& task, const TrainConfig& cfg, int64_t step) {
  std::mt19937_64 rng(cfg.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step) + 1);
  return task.sample(cfg.batch, rng);
}

}  // namespace

torch::optim::AdamWOptions adamw_options(const TrainConfig& cfg) {
  return torch::optim::AdamWOptions(cfg.lr).betas({cfg.beta1, cfg.beta2}).weight_decay(cfg.weight_decay);
}

torch::Tensor train_step(Transformer& model, torch::optim::AdamW& opt, const Batch& b, const TrainConfig& cfg) {
  opt.zero_grad();
  torch::Tensor loss;
  {
    AutocastGuard autocast(cfg.device, cfg.precision);
    loss = masked_loss(model->forward(b.input), b);  // logits f32 in either precision
  }
  loss.backward();
  if (cfg.clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
  opt.step();
  return loss;
}

EvalResult evaluate(Transformer& model, const std::vector<EvalSet>& sets, int64_t eval_batch, torch::Device dev,
                    Precision precision) {
  torch::NoGradGuard no_grad;
  AutocastGuard autocast(dev, precision);
  model->eval();
  EvalResult r;
  for (size_t si = 0; si < sets.size(); ++si) {
    const auto& set = sets[si];
    const int64_t n = set.data.input.size(0), T = set.data.input.size(1);
    double wrong = 0, count = 0, loss_sum = 0;
    std::vector<double> pos_ok(T, 0.0), pos_n(T, 0.0);
    for (int64_t s = 0; s < n; s += eval_batch) {
      auto b = to_device(slice(set.data, s, std::min(eval_batch, n - s)), dev);
      auto logits = model->forward(b.input);  // [B, T, V]
      auto ok = (logits.argmax(-1) == b.target) & b.mask;
      const int64_t m = b.mask.sum().item<int64_t>();
      if (m == 0) continue;
      loss_sum += masked_loss(logits, b).item<double>() * m;
      count += m;
      wrong += m - ok.sum().item<int64_t>();
      if (si == 0) {
        auto okp = ok.sum(0).to(torch::kDouble).cpu(), np = b.mask.sum(0).to(torch::kDouble).cpu();
        for (int64_t t = 0; t < T; ++t) {
          pos_ok[t] += okp[t].item<double>();
          pos_n[t] += np[t].item<double>();
        }
      }
    }
    r.error[set.name] = count > 0 ? wrong / count : NAN;
    r.loss[set.name] = count > 0 ? loss_sum / count : NAN;
    if (si == 0) {
      for (int64_t t = 0; t < T; ++t) r.pos_accuracy.push_back(pos_n[t] > 0 ? pos_ok[t] / pos_n[t] : NAN);
    }
  }
  model->train();
  return r;
}

TrainResult train(Transformer& model, const Task& task, const TrainConfig& cfg, const std::string& run_label) {
  model->to(cfg.device);
  model->train();
  torch::optim::AdamW opt(model->parameters(), adamw_options(cfg));
  const auto eval_sets = task.eval_sets(cfg.eval_size, cfg.seed + 7777);
  const fs::path out = cfg.out_dir;
  const fs::path ckpt = out / "ckpt";
  int64_t step = 0;
  if (!cfg.out_dir.empty()) fs::create_directories(out);
  if (cfg.resume && !cfg.out_dir.empty() && checkpoint_exists(ckpt.string())) {
    step = load_training_state(model, opt, ckpt.string(), cfg.device);
    std::cout << "[" << run_label << "] resumed from " << ckpt.string() << " at step " << step << std::endl;
  }

  // metrics.csv: one row per evaluation (appended on resume).
  std::ofstream csv;
  if (!cfg.out_dir.empty()) {
    const bool fresh = !(cfg.resume && fs::exists(out / "metrics.csv"));
    csv.open(out / "metrics.csv", fresh ? std::ios::trunc : std::ios::app);
    if (fresh) {
      csv << "step,elapsed_s,lr,train_loss,tokens_per_s";
      for (const auto& s : eval_sets) csv << "," << s.name << "_loss," << s.name << "_error";
      csv << "\n";
    }
  }

  TrainResult res;
  const int64_t T = task.seq_len();
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const int64_t start_step = step;
  double loss_acc = 0;
  int64_t loss_n = 0;
  double last_loss = NAN;
  while (step < cfg.steps) {
    const double lr = lr_at(cfg, step);
    for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    auto b = to_device(draw_batch(task, cfg, step), cfg.device);
    auto loss = train_step(model, opt, b, cfg);
    ++step;
    loss_acc += loss.item<double>();
    ++loss_n;

    const double secs = elapsed();
    const double tok_s = (step - start_step) * cfg.batch * T / std::max(secs, 1e-9);
    if (cfg.log_every > 0 && (step % cfg.log_every == 0 || step == cfg.steps)) {
      const double eta = secs / (step - start_step) * (cfg.steps - step);
      std::printf("[%s] step %ld/%ld  loss %.4f  lr %.2e  %.0f tok/s  elapsed %s  ETA %s\n", run_label.c_str(),
                  (long)step, (long)cfg.steps, loss.item<double>(), lr, tok_s, fmt_seconds(secs).c_str(),
                  fmt_seconds(eta).c_str());
      std::fflush(stdout);
    }
    const bool last = step == cfg.steps;
    if ((cfg.eval_every > 0 && step % cfg.eval_every == 0) || last) {
      auto ev = evaluate(model, eval_sets, cfg.eval_batch, cfg.device, cfg.precision);
      last_loss = loss_acc / std::max<int64_t>(1, loss_n);
      loss_acc = 0;
      loss_n = 0;
      std::printf("[%s] eval step %ld  train_loss %.4f", run_label.c_str(), (long)step, last_loss);
      for (const auto& s : eval_sets) std::printf("  %s err %.4f%%", s.name.c_str(), 100 * ev.error[s.name]);
      std::printf("\n");
      std::fflush(stdout);
      if (csv.is_open()) {
        csv << step << "," << secs << "," << lr << "," << last_loss << "," << tok_s;
        for (const auto& s : eval_sets) csv << "," << ev.loss[s.name] << "," << ev.error[s.name];
        csv << "\n";
        csv.flush();
      }
      res.final_eval = ev;
      const bool stop = cfg.stop_error >= 0 && ev.error[eval_sets[0].name] <= cfg.stop_error;
      if (stop) {
        std::printf("[%s] in-distribution error %.4f%% <= %.4f%%: stopping at step %ld\n", run_label.c_str(),
                    100 * ev.error[eval_sets[0].name], 100 * cfg.stop_error, (long)step);
      }
      if (!cfg.out_dir.empty() && (last || stop || (cfg.ckpt_every > 0 && step % cfg.ckpt_every == 0))) {
        save_checkpoint(model, task, opt, ckpt.string(), step);
      }
      if (stop) break;
    } else if (!cfg.out_dir.empty() && cfg.ckpt_every > 0 && step % cfg.ckpt_every == 0) {
      save_checkpoint(model, task, opt, ckpt.string(), step);
    }
  }
  res.steps_done = step;
  res.seconds = elapsed();
  res.final_train_loss = last_loss;
  if (step == start_step) res.final_eval = evaluate(model, eval_sets, cfg.eval_batch, cfg.device, cfg.precision);
  return res;
}

}  // namespace pathattn::model
