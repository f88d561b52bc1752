// pathattn_lm_eval: evaluates a language-model checkpoint of pathattn_train (--task lm):
//   - validation loss, perplexity and next-token error at the training length, on the trainer's own windows
//     (the same numbers as its last evaluation row when the checkpoint is the final one);
//   - loss by position on windows of --length tokens of the test split (default 16 x the training length),
//     bucketed, for the length-extrapolation plot (tools/plot_lm.py).
// Writes <out>/extrap.csv and <out>/eval.json. See docs/results/lm/README.md.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "checkpoint.h"
#include "cli.h"
#include "config_io.h"
#include "lm_eval.h"
#include "task_lm.h"
#include "trainer.h"

using namespace pathattn::model;

int main(int argc, char** argv) {
  CLI::App app{"Evaluate a pathattn_train language model: validation loss at the training length, loss by position"};
  std::string ckpt, data, out, split = "test", device = "cpu", precision = "auto";
  int64_t seq_len = 0, length = 0, windows = 16, batch = 1, bucket = 0, valid_windows = -1, eval_batch = 16;
  int threads = 0;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--ckpt", ckpt, "checkpoint folder (<run>/ckpt, or the run folder <run>)")->required();
  app.add_option("--data", data, "shard folder (tools/lm_data.py)")->required();
  app.add_option("--out", out, "output folder: extrap.csv, eval.json")->required();
  app.add_option("--split", split, "split of the long windows (test | valid | train)")->capture_default_str();
  app.add_option("--seq-len", seq_len, "training length T (0: the checkpoint's)")->capture_default_str();
  app.add_option("--length", length, "tokens per long window (0: 16 T)")->capture_default_str();
  app.add_option("--windows", windows, "long windows, evenly spaced over the split")->capture_default_str();
  app.add_option("--batch", batch, "long windows per forward")->capture_default_str();
  app.add_option("--bucket", bucket, "positions per CSV row (0: T / 4)")->capture_default_str();
  app.add_option("--valid-windows", valid_windows,
                 "validation windows at length T (-1: the run's --eval-size, its own set; 0: skip)")
      ->capture_default_str();
  app.add_option("--eval-batch", eval_batch, "validation windows per forward")->capture_default_str();
  app.add_option("--device", device, "cpu | cuda")->capture_default_str();
  app.add_option("--precision", precision, "auto (bf16 on cuda, f32 on cpu) | f32 | bf16")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all hardware threads)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    set_threads(threads);
    const torch::Device dev = parse_device(device);
    const Precision prec = parse_precision(precision, dev);
    auto ck = load_checkpoint(ckpt, dev);
    const auto& info = ck.info;
    auto& model = ck.model;
    if (info.task.name != "lm")
      throw std::invalid_argument("--ckpt " + ckpt + ": not a language-model run (its task is " + info.task.name + ")");
    if (seq_len <= 0) seq_len = info.task.lm.seq_len;
    if (length <= 0) length = 16 * seq_len;
    if (bucket <= 0) bucket = std::max<int64_t>(1, seq_len / 4);
    if (valid_windows < 0) {  // the run's own evaluation set: its size is in data.txt
      const std::string data_txt = info.dir + "/data.txt";
      valid_windows = std::stoll(key_value(parse_key_values(info.data_state, data_txt), "eval_size", data_txt));
    }
    const std::string mech = mechanism_name(model->config().mechanism);
    std::filesystem::create_directories(out);
    std::cout << "[eval/" << mech << "] step " << info.state.step << ", T " << seq_len << ", " << windows
              << " windows of " << length << " tokens from " << split << ", " << precision_name(prec) << std::endl;

    EvalResult valid;
    if (valid_windows > 0) {
      LmConfig lc;
      lc.data_dir = data;
      lc.seq_len = seq_len;
      auto task = make_lm(lc);
      valid = evaluate(model, task->eval_sets(valid_windows, 0), eval_batch, dev, prec);
      std::cout << "[eval/" << mech << "] valid at T: loss " << valid.loss["valid"] << ", ppl "
                << std::exp(valid.loss["valid"]) << ", error " << valid.error["valid"] << std::endl;
    }
    lm::TokenStream stream(lm::split_shards(data, split));
    const auto t0 = std::chrono::steady_clock::now();
    const auto pl = loss_by_position(model, stream, length, windows, batch, dev, prec);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    write_position_csv(pl, bucket, (std::filesystem::path(out) / "extrap.csv").string());

    // Ranges in multiples of T: [0, T), [T, 2T), [2T, 4T), [4T, 8T), ... up to the window length.
    std::ofstream js(std::filesystem::path(out) / "eval.json");
    js << "{\n  \"mechanism\": \"" << mech << "\", \"step\": " << info.state.step << ", \"seq_len\": " << seq_len
       << ", \"length\": " << length << ", \"windows\": " << windows << ", \"split\": \"" << split
       << "\", \"precision\": \"" << precision_name(prec) << "\", \"seconds\": " << secs << ",\n";
    if (valid_windows > 0) {
      js << "  \"valid\": {\"windows\": " << valid_windows << ", \"loss\": " << json_num(valid.loss["valid"])
         << ", \"ppl\": " << json_num(std::exp(valid.loss["valid"]))
         << ", \"error\": " << json_num(valid.error["valid"]) << "},\n";
    }
    js << "  \"ranges\": [";
    bool first = true;
    for (int64_t b = 0, e = seq_len; b < length; b = e, e *= 2) {
      const double m = pl.mean(b, e);
      js << (first ? "" : ",") << "\n    {\"begin\": " << b << ", \"end\": " << std::min(e, length)
         << ", \"loss\": " << json_num(m) << ", \"ppl\": " << json_num(std::exp(m)) << "}";
      std::cout << "[eval/" << mech << "] " << split << " positions [" << b << ", " << std::min(e, length) << "): loss "
                << m << ", ppl " << std::exp(m) << std::endl;
      first = false;
      if (e == 0) break;
    }
    js << "\n  ]\n}\n";
  } catch (const std::exception& e) {
    std::cerr << "pathattn_lm_eval: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
