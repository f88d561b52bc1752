// pathattn_generate: generation from a checkpoint of pathattn_train (docs/model.md "Generation"). Prompts come from
// the command line, a file, or the checkpoint's task; --eval-reads scores flip-flop reads answered by generation.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "checkpoint.h"
#include "cli.h"
#include "generate.h"
#include "speculative.h"
#include "precision.h"
#include "read_eval.h"

using namespace pathattn::model;

namespace {

// Token ids separated by spaces or commas; each must be in [0, vocab). `what` names the source in errors.
std::vector<int64_t> parse_ids(std::string text, int64_t vocab, const std::string& what) {
  for (char& c : text) if (c == ',') c = ' ';
  std::istringstream in(text);
  std::vector<int64_t> ids;
  for (std::string tok; in >> tok;) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != tok.size()) throw std::invalid_argument(what + ": '" + tok + "' is not a token id (an integer)");
    if (id < 0 || id >= vocab)
      throw std::invalid_argument(what + ": token id " + tok + " at position " + std::to_string(ids.size()) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    ids.push_back(id);
  }
  if (ids.empty()) throw std::invalid_argument(what + ": expected at least one token id, got none");
  return ids;
}

std::string show(const std::vector<int64_t>& ids, size_t tail = 0) {
  std::ostringstream o;
  const size_t start = tail > 0 && ids.size() > tail ? ids.size() - tail : 0;
  if (start > 0) o << "... ";
  for (size_t i = start; i < ids.size(); ++i) o << (i > start ? " " : "") << ids[i];
  return o.str();
}

struct Prompt {
  std::vector<int64_t> ids;
  int64_t expected = -1;  // the task's answer after the prompt (--sample), else -1
};

// N sequences from the task's generator, each cut after its last scored position: the prompt ends where the task's
// answer (a deterministic token: the bit after a read, the value after a query) comes next.
std::vector<Prompt> sample_prompts(const Task& task, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Batch b = task.sample(n, rng);
  std::vector<Prompt> r;
  for (int64_t i = 0; i < n; ++i) {
    auto m = b.mask[i].nonzero();
    if (m.size(0) == 0) throw std::invalid_argument("--sample: a drawn sequence has no scored position");
    const int64_t t = m[m.size(0) - 1][0].item<int64_t>();
    auto in = b.input[i].narrow(0, 0, t + 1).contiguous();
    r.push_back({std::vector<int64_t>(in.data_ptr<int64_t>(), in.data_ptr<int64_t>() + t + 1),
                 b.target[i][t].item<int64_t>()});
  }
  return r;
}

void print_rate(const char* what, int64_t tokens, double s) {
  std::printf("  %s: %ld tokens in %.2f ms = %.0f tok/s\n", what, (long)tokens, 1e3 * s, s > 0 ? tokens / s : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Generate from a pathattn_train checkpoint with the KV cache (greedy, temperature, top-k, top-p)"};
  std::string ckpt, prompt_text, prompt_file, task_name, device = "cpu", precision = "auto";
  int64_t n_sample = 0, n_reads = 0, tokens = 16, warmup = 1;
  double p_ignore = -1;
  uint64_t data_seed = 12345;
  int threads = 0;
  SamplingConfig s;
  SpeculativeConfig spec;
  int64_t speculative = 0;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--ckpt", ckpt, "checkpoint directory (<out>/ckpt of pathattn_train, or <out> itself)")->required();
  auto* o_prompt = app.add_option("--prompt", prompt_text, "prompt token ids, separated by spaces or commas");
  auto* o_file = app.add_option("--prompt-file", prompt_file, "file of prompts, one per line (token ids)");
  app.add_option("--task", task_name, "task of --sample / --eval-reads (default: the checkpoint's; must match it)");
  auto* o_sample = app.add_option("--sample", n_sample, "N prompts from the task's generator, each ending before an answer");
  auto* o_reads = app.add_option("--eval-reads", n_reads, "flip-flop: N sequences, generate after every read, report accuracy");
  o_prompt->excludes(o_file)->excludes(o_sample)->excludes(o_reads);
  o_file->excludes(o_sample)->excludes(o_reads);
  o_sample->excludes(o_reads);
  app.add_option("--p-ignore", p_ignore, "flip-flop p(ignore) of drawn sequences (default: the checkpoint's training value)");
  app.add_option("--data-seed", data_seed, "seed of drawn sequences (not the training stream's)")->capture_default_str();
  app.add_option("--tokens", tokens, "tokens to generate per prompt")->capture_default_str();
  app.add_option("--temperature", s.temperature, "0: greedy; > 0: sample softmax(logits / temperature)")->capture_default_str();
  app.add_option("--top-k", s.top_k, "sample among the k most likely tokens (0: off)")->capture_default_str();
  app.add_option("--top-p", s.top_p, "nucleus: sample within the smallest set of probability >= p, p in (0, 1] (1: off)")
      ->capture_default_str();
  app.add_option("--seed", s.seed, "sampler seed")->capture_default_str();
  app.add_option("--speculative", speculative,
                 "greedy only: K > 0 tokens guessed per step from the sequence itself (prompt lookup), scored in one "
                 "call without commit, the ones greedy decoding would pick kept (speculative.h); 0: off")
      ->capture_default_str();
  app.add_option("--ngram", spec.ngram, "with --speculative: the context suffix looked up")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed generations of each batch before the timed one (first-call costs)")
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all hardware threads)")->capture_default_str();
  app.add_option("--device", device, "cpu | cuda")->capture_default_str();
  app.add_option("--precision", precision, "auto (bf16 on cuda, f32 on cpu) | f32 | bf16 (autocast)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    s.validate();
    if (tokens < 0) throw std::invalid_argument("--tokens: expected >= 0, got " + std::to_string(tokens));
    if (warmup < 0) throw std::invalid_argument("--warmup: expected >= 0, got " + std::to_string(warmup));
    if (speculative < 0)
      throw std::invalid_argument("--speculative: expected >= 0, got " + std::to_string(speculative));
    if (speculative > 0) {
      spec.draft = speculative;
      try {
        spec.validate();
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("--speculative / --ngram: ") + e.what());
      }
      if (s.temperature != 0) throw std::invalid_argument("--speculative: greedy only (--temperature 0)");
      if (o_reads->count()) throw std::invalid_argument("--speculative: not with --eval-reads");
    }
    if (o_sample->count() && n_sample < 1) throw std::invalid_argument("--sample: expected >= 1, got " + std::to_string(n_sample));
    if (o_reads->count() && n_reads < 1) throw std::invalid_argument("--eval-reads: expected >= 1, got " + std::to_string(n_reads));
    if (!(o_prompt->count() || o_file->count() || o_sample->count() || o_reads->count()))
      throw std::invalid_argument("expected one of --prompt, --prompt-file, --sample N, --eval-reads N");
    set_threads(threads);
    const torch::Device dev = parse_device(device);
    const Precision prec = parse_precision(precision, dev);

    auto ck = load_checkpoint(ckpt, dev);
    const auto& mc = ck.model->config();
    const CheckpointInfo& info = ck.info;
    std::printf("checkpoint %s: step %ld, %s, %s, %ld layers, width %ld, %ld heads, vocab %ld, %ld parameters; "
                "%d threads, %s %s\n",
                info.dir.c_str(), (long)info.state.step, info.task.name.c_str(), mechanism_name(mc.mechanism), (long)mc.n_layer,
                (long)mc.d_model, (long)mc.n_head, (long)mc.vocab, (long)ck.model->num_parameters(),
                at::get_num_threads(), device.c_str(), precision_name(prec));
    std::printf("sampling: %s", s.temperature == 0 ? "greedy" : "temperature");
    if (s.temperature > 0)
      std::printf(" %g, top-k %ld, top-p %g, seed %lu", s.temperature, (long)s.top_k, s.top_p, (unsigned long)s.seed);
    std::printf("\n");

    // The task of --sample / --eval-reads: the checkpoint's, with --p-ignore applied.
    TaskConfig tcfg = info.task;
    if (!task_name.empty() && task_name != info.task.name)
      throw std::invalid_argument("--task " + task_name + ": the checkpoint was trained on " + info.task.name);
    if (p_ignore >= 0) {
      if (tcfg.name != "flipflop") throw std::invalid_argument("--p-ignore: only for flipflop checkpoints");
      if (p_ignore > 1) throw std::invalid_argument("--p-ignore: expected a probability in [0, 1], got " + std::to_string(p_ignore));
      tcfg.flipflop.p_ignore = p_ignore;
    }
    AutocastGuard autocast(dev, prec);

    if (o_reads->count()) {
      if (tcfg.name != "flipflop")
        throw std::invalid_argument("--eval-reads: only for flipflop checkpoints, this one is " + tcfg.name);
      std::mt19937_64 rng(data_seed);
      std::vector<std::vector<int64_t>> seqs;
      for (int64_t i = 0; i < n_reads; ++i) seqs.push_back(ff::sequence(tcfg.flipflop.pairs, tcfg.flipflop.p_ignore, rng));
      auto r = score_flipflop_reads(ck.model, seqs, s);
      std::printf("flip-flop reads answered by generation (p_ignore %g, %ld sequences of %ld tokens, data seed %lu):\n",
                  tcfg.flipflop.p_ignore, (long)n_reads, (long)(2 * tcfg.flipflop.pairs), (unsigned long)data_seed);
      std::printf("  read accuracy %.3f%% (%ld / %ld correct, error %.3f%%)\n", 100 * r.accuracy(), (long)r.correct,
                  (long)r.reads, 100 * (1 - r.accuracy()));
      print_rate("fed through the cache (prefills and decode steps of the segments between reads)", r.fed, r.seconds);
      return 0;
    }

    std::vector<Prompt> prompts;
    if (o_prompt->count()) {
      prompts.push_back({parse_ids(prompt_text, mc.vocab, "--prompt")});
    } else if (o_file->count()) {
      std::ifstream in(prompt_file);
      if (!in) throw std::invalid_argument("--prompt-file: cannot read '" + prompt_file + "'");
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r,") == std::string::npos) continue;  // blank line
        prompts.push_back({parse_ids(line, mc.vocab, "--prompt-file " + prompt_file + " line " + std::to_string(n))});
      }
      if (prompts.empty()) throw std::invalid_argument("--prompt-file: no prompts in '" + prompt_file + "'");
    } else {
      if (tcfg.name == "a5")
        throw std::invalid_argument("--sample: a5's labels are running products, not next tokens: nothing to generate");
      prompts = sample_prompts(*make_task(tcfg), n_sample, data_seed);
    }

    // Prompts of one length run as one batch (no padding); each batch prints its rates. Speculative generation
    // takes one prompt per batch (each sequence accepts its own number of draft tokens).
    std::map<size_t, std::vector<size_t>> by_len;
    for (size_t i = 0; i < prompts.size(); ++i)
      by_len[speculative > 0 ? i : prompts[i].ids.size()].push_back(i);
    std::vector<std::vector<int64_t>> out(prompts.size());
    GenerateStats total;
    SpeculativeStats spec_total;
    for (const auto& [key, idx] : by_len) {
      const size_t len = prompts[idx[0]].ids.size();
      auto batch = torch::empty({static_cast<int64_t>(idx.size()), static_cast<int64_t>(len)}, torch::kLong);
      for (size_t j = 0; j < idx.size(); ++j)
        std::copy(prompts[idx[j]].ids.begin(), prompts[idx[j]].ids.end(), batch[j].data_ptr<int64_t>());
      // Each generate() call starts from the same seed, so a warm-up draws what the timed call draws.
      auto run = [&](GenerateStats* st) {
        if (speculative == 0) return generate(ck.model, batch.to(dev), tokens, s, st);
        SpeculativeStats sp;
        auto r = generate_speculative(ck.model, batch.to(dev), tokens, spec, st, &sp);
        if (st) {
          spec_total.steps += sp.steps;
          spec_total.drafted += sp.drafted;
          spec_total.accepted += sp.accepted;
        }
        return r;
      };
      for (int64_t w = 0; w < warmup; ++w) run(nullptr);
      GenerateStats st;
      auto seq = run(&st).cpu().contiguous();
      for (size_t j = 0; j < idx.size(); ++j)
        out[idx[j]].assign(seq[j].data_ptr<int64_t>() + len, seq[j].data_ptr<int64_t>() + len + tokens);
      total.prefill_tokens += st.prefill_tokens;
      total.prefill_s += st.prefill_s;
      total.decode_tokens += st.decode_tokens;
      total.decode_s += st.decode_s;
    }
    int64_t answered = 0, right = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::printf("[%zu] prompt (%zu tokens): %s\n", i, prompts[i].ids.size(), show(prompts[i].ids, 24).c_str());
      std::printf("[%zu] generated: %s", i, show(out[i]).c_str());
      if (prompts[i].expected >= 0 && tokens > 0) {
        ++answered;
        right += out[i][0] == prompts[i].expected;
        std::printf("   (answer %ld: %s)", (long)prompts[i].expected, out[i][0] == prompts[i].expected ? "right" : "wrong");
      }
      std::printf("\n");
    }
    if (answered > 0) std::printf("first generated token is the task's answer: %ld / %ld\n", (long)right, (long)answered);
    std::printf("rates (%zu batch%s, after %ld untimed warm-up run%s each):\n", by_len.size(),
                by_len.size() == 1 ? "" : "es", (long)warmup, warmup == 1 ? "" : "s");
    print_rate("prefill", total.prefill_tokens, total.prefill_s);
    if (tokens > 0) print_rate("decode", total.decode_tokens, total.decode_s);
    if (speculative > 0)
      std::printf("speculative (prompt lookup, %ld tokens per draft, %ld-gram): %ld calls after the prefills for %ld "
                  "tokens; %ld of %ld drafted tokens accepted\n",
                  (long)spec.draft, (long)spec.ngram, (long)spec_total.steps, (long)total.decode_tokens,
                  (long)spec_total.accepted, (long)spec_total.drafted);
  } catch (const std::exception& e) {
    std::cerr << "pathattn_generate: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
