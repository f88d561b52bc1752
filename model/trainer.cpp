#include "trainer.h"

#include "checkpoint.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace pathattn::model {

namespace fs = std::filesystem;

TorchDeterminismGuard::TorchDeterminismGuard(bool on) : on_(on) {
  if (!on_) return;
  prev_ = at::globalContext().deterministicAlgorithms();
  prev_warn_only_ = at::globalContext().deterministicAlgorithmsWarnOnly();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

TorchDeterminismGuard::~TorchDeterminismGuard() {
  if (on_) at::globalContext().setDeterministicAlgorithms(prev_, prev_warn_only_);
}

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

// To a GPU through pinned memory without waiting (a blocking copy from pageable memory synchronises the stream,
// which would stall the host's launches of the step behind the GPU's work on the previous one).
Batch to_device(const Batch& b, torch::Device dev) {
  if (!dev.is_cuda()) return {b.input.to(dev), b.target.to(dev), b.mask.to(dev)};
  auto up = [&](const torch::Tensor& t) { return t.pin_memory().to(dev, /*non_blocking=*/true); };
  return {up(b.input), up(b.target), up(b.mask)};
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

// data.txt of a checkpoint (checkpoint.h): everything besides the step that decides which batches the run draws,
// which windows it evaluates on, and its learning-rate schedule (a resume with another --steps would bend the
// cosine mid-run: refused like other data).
std::string data_state_text(const Task& task, const TrainConfig& cfg) {
  std::ostringstream s;
  s.precision(17);
  s << "task=" << task.name() << "\nseq_len=" << task.seq_len() << "\nseed=" << cfg.seed << "\nbatch=" << cfg.batch
    << "\ngrad_accum=" << cfg.grad_accum << "\neval_size=" << cfg.eval_size << "\ndata=" << task.data_state()
    << "\nschedule=steps " << cfg.steps << " warmup " << cfg.warmup << " lr " << cfg.lr << " min_lr_ratio "
    << cfg.min_lr_ratio << " weight_decay " << cfg.weight_decay << " betas " << cfg.beta1 << " " << cfg.beta2
    << " clip " << cfg.clip << "\n";
  return s.str();
}

// metrics.csv after a resume from step `step`: rows past it were written by an invocation that stopped before its
// next checkpoint (killed at a device command's time limit); the resumed run writes them again.
void truncate_metrics(const fs::path& csv, int64_t step) {
  std::ifstream in(csv);
  std::vector<std::string> keep;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (header || std::stoll(line.substr(0, line.find(','))) <= step) keep.push_back(line);
    header = false;
  }
  in.close();
  std::ofstream out(csv, std::ios::trunc);
  for (const auto& l : keep) out << l << "\n";
}

}  // namespace

torch::optim::AdamWOptions adamw_options(const TrainConfig& cfg) {
  return torch::optim::AdamWOptions(cfg.lr).betas({cfg.beta1, cfg.beta2}).weight_decay(cfg.weight_decay);
}

Batch draw_batch(const Task& task, const TrainConfig& cfg, int64_t step, int64_t micro) {
  const uint64_t index = static_cast<uint64_t>(step) * static_cast<uint64_t>(cfg.grad_accum) + micro;
  std::mt19937_64 rng(cfg.seed * 0x9E3779B97F4A7C15ULL + index + 1);
  return task.sample(cfg.batch, rng);
}

torch::Tensor train_step(Transformer& model, torch::optim::AdamW& opt, const std::vector<Batch>& micro,
                         const TrainConfig& cfg) {
  if (micro.empty()) throw std::invalid_argument("train_step: expected at least one micro-batch");
  opt.zero_grad();
  const double n = static_cast<double>(micro.size());
  torch::Tensor total;
  for (const auto& b : micro) {
    torch::Tensor loss;
    {
      AutocastGuard autocast(cfg.device, cfg.precision);
      loss = masked_loss(model->forward(b.input), b);  // logits f32 in either precision
    }
    // One micro-batch: the loss as it is (bit for bit the step the trainer took before accumulation existed).
    (micro.size() == 1 ? loss : loss / n).backward();
    total = total.defined() ? total + loss.detach() : loss.detach();
  }
  if (cfg.clip > 0) clip_grad_norm_no_sync(model->parameters(), cfg.clip, cfg.foreach_step);
  if (cfg.foreach_step)
    adamw_step_foreach(opt);
  else
    opt.step();
  return micro.size() == 1 ? total : total / n;
}

torch::Tensor train_step(Transformer& model, torch::optim::AdamW& opt, const Batch& b, const TrainConfig& cfg) {
  return train_step(model, opt, std::vector<Batch>{b}, cfg);
}

ScoreCounts score_batch(const torch::Tensor& logits, const Batch& b) {
  torch::NoGradGuard no_grad;
  const int64_t T = b.mask.size(1);
  auto mask = b.mask.to(logits.device());
  auto right = (logits.argmax(-1) == b.target.to(logits.device())) & mask;  // [B, T]
  auto wrong = mask & ~right;
  auto has = mask.any(1), any_wrong = wrong.any(1);  // [B]
  // Position t of a sequence is "prefix right" when none of its scored positions 0..t is wrong.
  auto prefix_right = (wrong.to(torch::kLong).cumsum(1) == 0);
  ScoreCounts c;
  c.scored = mask.sum().item<int64_t>();
  c.wrong = wrong.sum().item<int64_t>();
  c.sequences = has.sum().item<int64_t>();
  c.seq_wrong = any_wrong.sum().item<int64_t>();
  auto ps = mask.sum(0).cpu(), pr = right.sum(0).cpu(), px = prefix_right.sum(0).cpu();
  auto aps = ps.accessor<int64_t, 1>(), apr = pr.accessor<int64_t, 1>(), apx = px.accessor<int64_t, 1>();
  for (int64_t t = 0; t < T; ++t) {
    c.pos_scored.push_back(aps[t]);
    c.pos_right.push_back(apr[t]);
    c.prefix_right.push_back(apx[t]);
  }
  return c;
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
    double loss_sum = 0;
    ScoreCounts total;
    total.pos_scored.assign(T, 0);
    total.pos_right.assign(T, 0);
    total.prefix_right.assign(T, 0);
    int64_t seen = 0;  // sequences evaluated (the denominator of prefix_seq_accuracy)
    for (int64_t s = 0; s < n; s += eval_batch) {
      auto b = to_device(slice(set.data, s, std::min(eval_batch, n - s)), dev);
      auto logits = model->forward(b.input);  // [B, T, V]
      const auto c = score_batch(logits, b);
      seen += b.input.size(0);
      if (c.scored == 0) continue;
      loss_sum += masked_loss(logits, b).item<double>() * c.scored;
      total.scored += c.scored;
      total.wrong += c.wrong;
      total.sequences += c.sequences;
      total.seq_wrong += c.seq_wrong;
      for (int64_t t = 0; t < T; ++t) {
        total.pos_scored[t] += c.pos_scored[t];
        total.pos_right[t] += c.pos_right[t];
        total.prefix_right[t] += c.prefix_right[t];
      }
    }
    const double count = static_cast<double>(total.scored);
    r.error[set.name] = count > 0 ? total.wrong / count : NAN;
    r.loss[set.name] = count > 0 ? loss_sum / count : NAN;
    r.seq_error[set.name] =
        total.sequences > 0 ? static_cast<double>(total.seq_wrong) / static_cast<double>(total.sequences) : NAN;
    if (si == 0) {
      for (int64_t t = 0; t < T; ++t) {
        r.pos_accuracy.push_back(total.pos_scored[t] > 0 ? static_cast<double>(total.pos_right[t]) /
                                                               static_cast<double>(total.pos_scored[t])
                                                         : NAN);
        r.prefix_seq_accuracy.push_back(seen > 0 ? static_cast<double>(total.prefix_right[t]) / seen : NAN);
      }
    }
  }
  model->train();
  return r;
}

TrainResult train(Transformer& model, const Task& task, const TrainConfig& cfg, const std::string& run_label) {
  if (cfg.grad_accum < 1)
    throw std::invalid_argument("grad_accum: expected >= 1, got " + std::to_string(cfg.grad_accum));
  if (cfg.batch < 1) throw std::invalid_argument("batch: expected >= 1, got " + std::to_string(cfg.batch));
  if (cfg.stop_seq_error >= 0 && task.language_model())
    throw std::invalid_argument("stop_seq_error: expected -1 (off) for a language model (task " + task.name() +
                                "), whose windows have no sequence error");
  if (cfg.device.is_cuda()) model->config().validate_on_cuda();
  const TorchDeterminismGuard torch_determinism(cfg.torch_deterministic);
  model->to(cfg.device);
  model->train();
  PathRunOptions run;  // a training run: the op itself (never the timing-only substitute)
  run.deterministic_backward = cfg.deterministic;
  model->set_path_run_options(run);
  torch::optim::AdamW opt(model->parameters(), adamw_options(cfg));
  const auto eval_sets = task.eval_sets(cfg.eval_size, cfg.seed + 7777);
  const fs::path out = cfg.out_dir;
  const std::string ckpt = (out / "ckpt").string();
  const std::string data_state = data_state_text(task, cfg);
  const TaskConfig task_config = task.config();
  TrainerState st;
  bool resumed = false;
  if (!cfg.out_dir.empty()) fs::create_directories(out);
  if (cfg.resume && !cfg.out_dir.empty() && has_checkpoint(ckpt)) {
    const auto info = read_checkpoint_info(ckpt);
    if (info.data_state.empty()) {
      std::cout << "[" << run_label << "] warning: " << ckpt << " has no data.txt; the data stream is not checked"
                << std::endl;
    } else if (info.data_state != data_state) {
      throw std::runtime_error("--resume: the checkpoint's data stream (" + info.dir + "/data.txt)\n" + info.data_state +
                               "differs from this run's\n" + data_state);
    }
    load_training_state(model, opt, info, cfg.device);
    st = info.state;
    resumed = true;
    std::cout << "[" << run_label << "] resumed from " << info.dir << " at step " << st.step << std::endl;
  } else if (!cfg.init_from.empty()) {
    const auto report = init_from_checkpoint(model, cfg.init_from);
    const std::string text = format_init_report(report, cfg.init_from);
    std::cout << "[" << run_label << "] " << text.substr(0, text.find('\n')) << std::endl;
    for (const auto& n : report.fresh) std::cout << "[" << run_label << "]   new " << n << std::endl;
    for (const auto& n : report.dropped) std::cout << "[" << run_label << "]   dropped " << n << std::endl;
    if (!cfg.out_dir.empty()) std::ofstream(out / "init_report.txt") << text;
  }

  // metrics.csv: one row per evaluation (appended on resume, after the rows up to the checkpoint). Synthetic tasks
  // add each set's sequence error (EvalResult::seq_error) after the losses and errors; a resumed file keeps the
  // columns of its header (one written before the sequence error existed gets none).
  bool seq_metric = !task.language_model();
  std::ofstream csv;
  if (!cfg.out_dir.empty()) {
    const bool fresh = !(resumed && fs::exists(out / "metrics.csv"));
    if (!fresh) {
      truncate_metrics(out / "metrics.csv", st.step);
      std::ifstream head(out / "metrics.csv");
      std::string header;
      std::getline(head, header);
      seq_metric = seq_metric && header.find("_seq_error") != std::string::npos;
    }
    csv.open(out / "metrics.csv", fresh ? std::ios::trunc : std::ios::app);
    csv.precision(10);
    if (fresh) {
      csv << "step,elapsed_s,lr,train_loss,tokens_per_s";
      for (const auto& s : eval_sets) csv << "," << s.name << "_loss," << s.name << "_error";
      if (seq_metric)
        for (const auto& s : eval_sets) csv << "," << s.name << "_seq_error";
      csv << "\n";
    }
  }

  TrainResult res;
  const int64_t T = task.seq_len();
  res.tokens_per_step = cfg.batch * cfg.grad_accum * T;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const int64_t start_step = st.step;
  const double seconds_before = st.seconds;
  double last_loss = NAN;
  // The steps' losses stay on the device until the loop prints or saves them: reading one waits for the GPU, and
  // the host should run ahead, queueing the next step while the GPU works (the small models are launch-bound).
  // They are added to loss_sum in step order, as doubles, as a per-step read did: the same bits.
  std::vector<torch::Tensor> pending;
  double step_loss = NAN;  // the last read step's
  auto read_losses = [&] {
    if (pending.empty()) return;
    const torch::Tensor host = torch::stack(pending).to(torch::kCPU).to(torch::kDouble);
    const auto a = host.accessor<double, 1>();
    for (int64_t i = 0; i < a.size(0); ++i) {
      st.loss_sum += a[i];
      ++st.loss_count;
    }
    step_loss = a[a.size(0) - 1];
    pending.clear();
  };
  while (st.step < cfg.steps) {
    const double lr = lr_at(cfg, st.step);
    for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    std::vector<Batch> micro;
    for (int64_t m = 0; m < cfg.grad_accum; ++m)
      micro.push_back(to_device(draw_batch(task, cfg, st.step, m), cfg.device));
    pending.push_back(train_step(model, opt, micro, cfg).reshape({}));
    ++st.step;
    if (pending.size() >= 512) read_losses();  // a bound on what waits; a read every 512 steps costs nothing

    const double secs = elapsed();
    st.seconds = seconds_before + secs;
    const int64_t done_here = st.step - start_step;
    const double tok_s = done_here * res.tokens_per_step / std::max(secs, 1e-9);
    if (cfg.log_every > 0 && (st.step % cfg.log_every == 0 || st.step == cfg.steps)) {
      read_losses();
      const double loss = step_loss;
      const double eta = secs / done_here * (cfg.steps - st.step);
      std::printf("[%s] step %ld/%ld  loss %.4f  lr %.2e  %.0f tok/s  %.1fM tok  elapsed %s  ETA %s\n",
                  run_label.c_str(), (long)st.step, (long)cfg.steps, loss, lr, tok_s,
                  st.step * res.tokens_per_step / 1e6, fmt_seconds(st.seconds).c_str(), fmt_seconds(eta).c_str());
      std::fflush(stdout);
    }
    const bool last = st.step == cfg.steps;
    bool stop = false;
    if ((cfg.eval_every > 0 && st.step % cfg.eval_every == 0) || last) {
      auto ev = evaluate(model, eval_sets, cfg.eval_batch, cfg.device, cfg.precision);
      read_losses();
      last_loss = st.loss_sum / std::max<int64_t>(1, st.loss_count);
      st.loss_sum = 0;
      st.loss_count = 0;
      std::printf("[%s] eval step %ld  train_loss %.4f", run_label.c_str(), (long)st.step, last_loss);
      for (const auto& s : eval_sets) {
        std::printf("  %s loss %.4f", s.name.c_str(), ev.loss[s.name]);
        if (task.language_model()) std::printf(" ppl %.3f", std::exp(ev.loss[s.name]));
        std::printf(" err %.4f%%", 100 * ev.error[s.name]);
      }
      std::printf("\n");
      std::fflush(stdout);
      if (csv.is_open()) {
        csv << st.step << "," << st.seconds << "," << lr << "," << last_loss << "," << tok_s;
        for (const auto& s : eval_sets) csv << "," << ev.loss[s.name] << "," << ev.error[s.name];
        if (seq_metric)
          for (const auto& s : eval_sets) csv << "," << ev.seq_error[s.name];
        csv << "\n";
        csv.flush();
      }
      res.final_eval = ev;
      const std::string& first = eval_sets[0].name;
      if (cfg.stop_error >= 0 && ev.error[first] <= cfg.stop_error) {
        stop = true;
        res.stop_reason = "stop_error";
        std::printf("[%s] in-distribution error %.4f%% <= %.4f%%: stopping at step %ld\n", run_label.c_str(),
                    100 * ev.error[first], 100 * cfg.stop_error, (long)st.step);
      } else if (cfg.stop_seq_error >= 0 && ev.seq_error[first] <= cfg.stop_seq_error) {
        stop = true;
        res.stop_reason = "stop_seq_error";
        std::printf("[%s] in-distribution sequence error %.4f%% <= %.4f%%: stopping at step %ld\n",
                    run_label.c_str(), 100 * ev.seq_error[first], 100 * cfg.stop_seq_error, (long)st.step);
      }
    }
    // This invocation's limits (a bounded device command): stop with a checkpoint, to be resumed.
    const bool limit = !last && !stop && ((cfg.stop_after > 0 && done_here >= cfg.stop_after) ||
                                          (cfg.time_limit_s > 0 && secs >= cfg.time_limit_s));
    if (limit) {
      res.stop_reason = cfg.stop_after > 0 && done_here >= cfg.stop_after ? "stop_after" : "time_limit";
      std::printf("[%s] stopping this invocation at step %ld (%s); resume to continue\n", run_label.c_str(),
                  (long)st.step, cfg.stop_after > 0 && done_here >= cfg.stop_after ? "--stop-after" : "--time-limit");
      std::fflush(stdout);
    }
    if (!cfg.out_dir.empty() && (last || stop || limit || (cfg.ckpt_every > 0 && st.step % cfg.ckpt_every == 0))) {
      read_losses();  // the checkpoint holds loss_sum
      save_checkpoint(model, opt, ckpt, st, task_config, data_state);
    }
    if (stop || limit) {
      res.stopped_early = true;
      break;
    }
  }
  read_losses();
  res.steps_done = st.step;
  res.seconds = st.seconds;
  res.final_train_loss = last_loss;
  if (st.step == start_step) res.final_eval = evaluate(model, eval_sets, cfg.eval_batch, cfg.device, cfg.precision);
  return res;
}

}  // namespace pathattn::model
