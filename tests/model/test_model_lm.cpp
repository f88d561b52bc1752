// The language-model pieces: the shard reader (format, every way a file can be wrong), the lm task's windows, the
// trainer's gradient accumulation and chunked runs (resume equals an uninterrupted run bit for bit, data and model
// mismatches refused), the model config on disk, --init-from (RoPE -> PaTH), loss by position.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint.h"
#include "config_io.h"
#include "dir_ops.h"
#include "lm_eval.h"
#include "task_lm.h"
#include "test_util.h"
#include "tolerances_model.h"
#include "trainer.h"

using namespace pathattn::model;
using test_util::error_of;  // any exception's message
using test_util::temp_dir;
namespace fs = std::filesystem;

namespace {

std::vector<uint16_t> tokens(int64_t n, uint32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> t(n);
  for (auto& x : t) x = static_cast<uint16_t>(rng() % vocab);
  return t;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void put_bytes(const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary | std::ios::trunc) << b; }

// A data folder: three train shards (the stream crosses two boundaries) and one valid shard, random tokens.
constexpr uint32_t kVocab = 40;
fs::path lm_data(const std::string& name) {
  auto d = temp_dir(name);
  for (int i = 0; i < 3; ++i) {
    lm::write_shard((d / ("train-0000" + std::to_string(i) + ".tok")).string(), kVocab,
                    tokens(500 + 37 * i, kVocab, i));
  }
  lm::write_shard((d / "valid-00000.tok").string(), kVocab, tokens(300, kVocab, 9));
  return d;
}

ModelConfig tiny(Mechanism m) { return test_util::tiny(m, kVocab); }

TrainConfig tiny_train() {
  TrainConfig tc;
  tc.steps = 8;
  tc.batch = 2;
  tc.grad_accum = 2;
  tc.warmup = 2;
  tc.lr = 3e-3;
  tc.eval_every = 2;
  tc.eval_size = 4;
  tc.log_every = 0;
  return tc;
}

// metrics.csv without the columns that measure time (elapsed_s, tokens_per_s).
std::vector<std::string> curve(const fs::path& csv) {
  std::ifstream f(csv);
  std::vector<std::string> rows;
  std::string line;
  while (std::getline(f, line)) {
    std::vector<std::string> cols;
    std::stringstream s(line);
    std::string c;
    while (std::getline(s, c, ',')) cols.push_back(c);
    std::string kept;
    for (size_t i = 0; i < cols.size(); ++i)
      if (i != 1 && i != 4) kept += cols[i] + ",";
    rows.push_back(kept);
  }
  return rows;
}

}  // namespace

TEST(ModelLmShard, Crc32IsZlibs) {
  const char check[] = "123456789";
  EXPECT_EQ(lm::crc32(check, 9), 0xCBF43926u);  // the CRC-32 check value (zlib.crc32(b"123456789"))
  EXPECT_EQ(lm::crc32(check + 4, 5, lm::crc32(check, 4)), 0xCBF43926u);  // continued in pieces
}

TEST(ModelLmShard, WriteThenReadGivesTheTokens) {
  auto d = temp_dir("rw");
  const auto t = tokens(1234, 300, 1);
  lm::write_shard((d / "a.tok").string(), 300, t);
  lm::MappedShard s((d / "a.tok").string());
  EXPECT_EQ(s.vocab(), 300u);
  ASSERT_EQ(s.size(), 1234);
  EXPECT_TRUE(std::equal(t.begin(), t.end(), s.tokens()));
  EXPECT_EQ(fs::file_size(d / "a.tok"), lm::kShardHeaderBytes + 2 * 1234);
  pathattn::model::remove_tree(d);
}

// Every way a shard can be wrong is refused with the file's name and what was expected.
TEST(ModelLmShard, BadFilesAreRefusedWithTheReason) {
  auto d = temp_dir("bad");
  const std::string good_path = (d / "good.tok").string();
  lm::write_shard(good_path, 50, tokens(64, 50, 2));
  const std::string good = bytes_of(good_path);
  auto variant = [&](const std::string& name, std::string b) {
    put_bytes(d / name, b);
    return (d / name).string();
  };
  std::string b = good;
  b[0] = 'X';
  const std::string magic = variant("magic.tok", b);
  const std::string truncated = variant("truncated.tok", good.substr(0, good.size() - 2));
  const std::string header_only = variant("short.tok", good.substr(0, 20));
  const std::string trailing = variant("trailing.tok", good + "xy");
  b = good;
  b[40] ^= 1;
  const std::string flipped = variant("flipped.tok", b);
  b = good;
  b[8] = 2;
  const std::string version = variant("version.tok", b);
  b = good;
  b[28] = 4;
  const std::string width = variant("width.tok", b);
  const std::string big_id = (d / "big_id.tok").string();
  lm::write_shard(big_id, 10, {1, 2, 12});  // the writer does not check; the reader must
  const std::pair<std::string, std::string> cases[] = {{magic, "bad magic"},
                                                       {truncated, "truncated"},
                                                       {header_only, "truncated"},
                                                       {trailing, "trailing bytes"},
                                                       {flipped, "checksum"},
                                                       {version, "version 2, expected 1"},
                                                       {width, "bytes per token 4"},
                                                       {big_id, "token 12 at 2 is not below vocab 10"},
                                                       {(d / "missing.tok").string(), "cannot open"}};
  for (const auto& [path, what] : cases) {
    const std::string msg = error_of([&] { lm::MappedShard s(path); });
    EXPECT_NE(msg.find(what), std::string::npos) << path << ": " << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << "the message must name the file: " << msg;
  }
  EXPECT_EQ(error_of([&] { lm::MappedShard s(good_path); }), "");
  pathattn::model::remove_tree(d);
}

TEST(ModelLmShard, SplitShardsAreNumberedWithoutGaps) {
  auto d = lm_data("split");
  EXPECT_EQ(lm::split_shards(d.string(), "train").size(), 3u);
  EXPECT_EQ(lm::split_shards(d.string(), "train", 2).size(), 2u);
  EXPECT_NE(error_of([&] { lm::split_shards(d.string(), "train", 4); }).find("4 train shards asked for"),
            std::string::npos);
  EXPECT_NE(error_of([&] { lm::split_shards(d.string(), "test"); }).find("no test-00000.tok"), std::string::npos);
  fs::remove(d / "train-00001.tok");
  EXPECT_NE(error_of([&] { lm::split_shards(d.string(), "train"); }).find("gaps"), std::string::npos);
  pathattn::model::remove_tree(d);
}

TEST(ModelLmShard, StreamCopiesAcrossShardBoundaries) {
  auto d = lm_data("stream");
  lm::TokenStream s(lm::split_shards(d.string(), "train"));
  std::vector<uint16_t> all;
  for (int i = 0; i < 3; ++i) {
    auto t = tokens(500 + 37 * i, kVocab, i);
    all.insert(all.end(), t.begin(), t.end());
  }
  ASSERT_EQ(s.size(), static_cast<int64_t>(all.size()));
  EXPECT_EQ(s.vocab(), kVocab);
  for (int64_t start : {0L, 490L, 999L, 1000L, static_cast<long>(all.size()) - 20}) {
    std::vector<int64_t> got(20);
    s.copy(start, 20, got.data());  // 490 + 20 and 1000 + ... cross the boundaries at 500 and 1037
    for (int64_t i = 0; i < 20; ++i) ASSERT_EQ(got[i], all[start + i]) << start << "+" << i;
  }
  std::vector<int64_t> buf(2);
  EXPECT_THROW(s.copy(s.size() - 1, 2, buf.data()), std::out_of_range);
  // The fingerprint follows the data: another shard set gives another one.
  lm::TokenStream two(lm::split_shards(d.string(), "train", 2));
  EXPECT_NE(two.fingerprint(), s.fingerprint());
  pathattn::model::remove_tree(d);
}

TEST(ModelLmTask, WindowsFollowTheGeneratorAndTheStream) {
  auto d = lm_data("task");
  LmConfig lc;
  lc.data_dir = d.string();
  lc.seq_len = 16;
  auto task = make_lm(lc);
  EXPECT_EQ(task->vocab(), kVocab);
  EXPECT_TRUE(task->language_model());
  // The task reports its options (a checkpoint's config.txt records them) and make_task rebuilds it from them.
  const TaskConfig tc = task->config();
  EXPECT_EQ(tc.name, "lm");
  EXPECT_EQ(tc.lm.data_dir, lc.data_dir);
  EXPECT_EQ(tc.lm.seq_len, 16);
  EXPECT_EQ(make_task(tc)->data_state(), task->data_state());
  lm::TokenStream train(lm::split_shards(d.string(), "train"));
  std::mt19937_64 a(5), b(5), c(5);
  auto x = task->sample(3, a), y = task->sample(3, b);
  EXPECT_TRUE(torch::equal(x.input, y.input));  // the same generator state gives the same windows
  EXPECT_TRUE(x.mask.all().item<bool>());
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<int64_t> w(17);
    train.copy(window_start(c(), train.size(), 16), 17, w.data());
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(x.input[i][t].item<int64_t>(), w[t]);
      EXPECT_EQ(x.target[i][t].item<int64_t>(), w[t + 1]);  // the next token
    }
  }
  // Validation: the same fixed windows on every call, the first at the start of the stream, the last at its end.
  auto v1 = task->eval_sets(5, 1), v2 = task->eval_sets(5, 2);
  ASSERT_EQ(v1.size(), 1u);
  EXPECT_EQ(v1[0].name, "valid");
  EXPECT_TRUE(torch::equal(v1[0].data.input, v2[0].data.input));
  lm::TokenStream valid(lm::split_shards(d.string(), "valid"));
  std::vector<int64_t> last(17);
  valid.copy(valid.size() - 17, 17, last.data());
  EXPECT_EQ(v1[0].data.target[4][15].item<int64_t>(), last[16]);
  LmConfig too_long = lc;
  too_long.seq_len = 5000;
  EXPECT_NE(error_of([&] { make_lm(too_long); }).find("has 1611 tokens, fewer than seq_len + 1 = 5001"),
            std::string::npos);
  pathattn::model::remove_tree(d);
}

TEST(ModelLmTrainer, DrawBatchSeedsByStepAndMicroBatch) {
  auto d = lm_data("draw");
  LmConfig lc;
  lc.data_dir = d.string();
  lc.seq_len = 8;
  auto task = make_lm(lc);
  TrainConfig one = tiny_train(), two = tiny_train();
  one.grad_accum = 1;
  two.grad_accum = 2;
  // grad_accum 1 keeps the stream the trainer always drew: batch s from seed * C + s + 1.
  std::mt19937_64 rng(one.seed * 0x9E3779B97F4A7C15ULL + 3 + 1);
  EXPECT_TRUE(torch::equal(draw_batch(*task, one, 3).input, task->sample(one.batch, rng).input));
  // With accumulation, micro-batch m of step s is the stream's element s * K + m: all distinct, none repeated.
  EXPECT_TRUE(torch::equal(draw_batch(*task, two, 1, 1).input, draw_batch(*task, one, 3).input));
  EXPECT_FALSE(torch::equal(draw_batch(*task, two, 1, 0).input, draw_batch(*task, two, 1, 1).input));
  pathattn::model::remove_tree(d);
}

// Two micro-batches of B sequences give the gradient of one batch of the same 2B sequences (every position scored,
// so the mean of the two means is the mean).
TEST(ModelLmTrainer, GradientAccumulationEqualsTheLargerBatch) {
  auto d = lm_data("accum");
  LmConfig lc;
  lc.data_dir = d.string();
  lc.seq_len = 24;
  auto task = make_lm(lc);
  std::mt19937_64 rng(3);
  const Batch whole = task->sample(4, rng);
  auto half = [&](int64_t s) {
    return Batch{whole.input.narrow(0, s, 2), whole.target.narrow(0, s, 2), whole.mask.narrow(0, s, 2)};
  };
  TrainConfig tc = tiny_train();
  tc.lr = 0;  // AdamW leaves the weights alone: the gradients of the two runs are compared on the same weights
  tc.clip = 0;
  std::vector<torch::Tensor> grads[2];
  double losses[2];
  for (int k = 0; k < 2; ++k) {
    torch::manual_seed(4);
    Transformer model(tiny(Mechanism::path));
    torch::optim::AdamW opt(model->parameters(), adamw_options(tc));
    losses[k] =
        (k == 0 ? train_step(model, opt, whole, tc) : train_step(model, opt, {half(0), half(2)}, tc)).item<double>();
    for (const auto& p : model->parameters()) grads[k].push_back(p.grad().clone());
  }
  EXPECT_NEAR(losses[1], losses[0], test_tol::kAccumVsBatch * std::abs(losses[0]));
  for (size_t i = 0; i < grads[0].size(); ++i) {
    const double scale = grads[0][i].abs().max().item<double>();
    EXPECT_LT((grads[1][i] - grads[0][i]).abs().max().item<double>(), test_tol::kAccumVsBatch * scale) << "param " << i;
  }
  pathattn::model::remove_tree(d);
}

// A run chunked into invocations (--stop-after, a checkpoint, --resume) is the uninterrupted run: the same weights
// bit for bit and the same metrics.csv curve, also when the first invocation wrote a row past its checkpoint (killed
// before the next one). One thread: the op's multi-threaded CPU backward is not bitwise reproducible.
TEST(ModelLmTrainer, ChunkedRunEqualsUninterruptedRun) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto d = lm_data("chunk");
  auto out = temp_dir("chunk_out");
  LmConfig lc;
  lc.data_dir = d.string();
  lc.seq_len = 16;
  auto task = make_lm(lc);
  TrainConfig tc = tiny_train();
  tc.out_dir = (out / "straight").string();
  torch::manual_seed(8);
  Transformer straight(tiny(Mechanism::path));
  train(straight, *task, tc, "straight");

  TrainConfig part = tc;
  part.out_dir = (out / "chunked").string();
  part.stop_after = 3;  // between evaluations (every 2): the running train loss must travel in the checkpoint
  torch::manual_seed(8);
  Transformer first(tiny(Mechanism::path));
  auto r1 = train(first, *task, part, "first");
  EXPECT_TRUE(r1.stopped_early);
  EXPECT_EQ(r1.steps_done, 3);
  std::ofstream(out / "chunked" / "metrics.csv", std::ios::app) << "4,0,0,9,0,9,9\n";  // a row of a killed run
  part.resume = true;
  torch::manual_seed(99);  // another initialisation, replaced by the checkpoint's
  Transformer second(tiny(Mechanism::path));
  auto r2 = train(second, *task, part, "second");  // 3 more steps, stops at 6
  EXPECT_EQ(r2.steps_done, 6);
  part.stop_after = 0;
  Transformer third(tiny(Mechanism::path));
  auto r3 = train(third, *task, part, "third");
  EXPECT_EQ(r3.steps_done, 8);
  EXPECT_FALSE(r3.stopped_early);
  auto pa = straight->parameters(), pb = third->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
  EXPECT_EQ(curve(out / "straight" / "metrics.csv"), curve(out / "chunked" / "metrics.csv"));
  EXPECT_EQ(curve(out / "straight" / "metrics.csv").size(), 5u);  // header + steps 2, 4, 6, 8
  pathattn::model::remove_tree(d);
  pathattn::model::remove_tree(out);
  at::set_num_threads(threads);
}

TEST(ModelLmTrainer, TimeLimitStopsWithACheckpoint) {
  auto d = lm_data("time");
  auto out = temp_dir("time_out");
  LmConfig lc;
  lc.data_dir = d.string();
  lc.seq_len = 8;
  auto task = make_lm(lc);
  TrainConfig tc = tiny_train();
  tc.out_dir = out.string();
  tc.time_limit_s = 1e-9;  // every step ends past it: the first step is the last of this invocation
  torch::manual_seed(1);
  Transformer model(tiny(Mechanism::rope));
  auto r = train(model, *task, tc, "time");
  EXPECT_TRUE(r.stopped_early);
  EXPECT_EQ(r.steps_done, 1);
  EXPECT_EQ(read_checkpoint_info((out / "ckpt").string()).state.step, 1);
  pathattn::model::remove_tree(d);
  pathattn::model::remove_tree(out);
}

// A resume on other data (another prefix of the shards) or with another model is refused, saying what differs.
TEST(ModelLmTrainer, ResumeOnOtherDataOrModelIsRefused) {
  auto d = lm_data("refuse");
  auto out = temp_dir("refuse_out");
  LmConfig lc;
  lc.data_dir = d.string();
  lc.seq_len = 8;
  TrainConfig tc = tiny_train();
  tc.out_dir = out.string();
  tc.stop_after = 1;
  torch::manual_seed(1);
  Transformer model(tiny(Mechanism::rope));
  train(model, *make_lm(lc), tc, "first");
  tc.resume = true;
  LmConfig fewer = lc;
  fewer.train_shards = 2;
  Transformer again(tiny(Mechanism::rope));
  const std::string data_msg = error_of([&] { train(again, *make_lm(fewer), tc, "other data"); });
  EXPECT_NE(data_msg.find("data stream"), std::string::npos) << data_msg;
  EXPECT_NE(data_msg.find("shards=2"), std::string::npos) << data_msg;
  TrainConfig other_batch = tc;
  other_batch.batch = 3;
  EXPECT_NE(error_of([&] { train(again, *make_lm(lc), other_batch, "other batch"); }).find("batch=3"),
            std::string::npos);
  Transformer path(tiny(Mechanism::path));
  const std::string model_msg = error_of([&] { train(path, *make_lm(lc), tc, "other model"); });
  EXPECT_NE(model_msg.find("mechanism: rope vs path"), std::string::npos) << model_msg;
  pathattn::model::remove_tree(d);
  pathattn::model::remove_tree(out);
}

TEST(ModelLmCheckpoint, ConfigRoundTripsAndBadTextIsRefused) {
  ModelConfig c = tiny(Mechanism::path_fox);
  c.n_kv_head = 1;
  c.mlp_hidden = 40;
  c.qk_norm = true;
  c.beta_max = 1.5;
  c.w_rank = 8;
  c.low_rank_w = false;
  c.w_shortconv = false;
  c.conv_size = 4;
  c.gate_scale = GateScale::fla;
  c.rope_base = 500000.0;
  // The lm task's options travel with the model (a path with a space and an '=' survives).
  TaskConfig t;
  t.name = "lm";
  t.lm.data_dir = "/data/lm shards/v=2";
  t.lm.seq_len = 77;
  t.lm.train_shards = 3;
  const RunConfig back = config_from_text(config_to_text(c, t));
  EXPECT_EQ(config_diff(c, back.model), "");
  EXPECT_EQ(config_diff(c, ModelConfig{}).empty(), false);
  EXPECT_EQ(back.task.name, "lm");
  EXPECT_EQ(back.task.lm.data_dir, t.lm.data_dir);
  EXPECT_EQ(back.task.lm.seq_len, 77);
  EXPECT_EQ(back.task.lm.train_shards, 3);
  EXPECT_NE(error_of([] { config_from_text("vocab=3\n"); }).find("missing key 'n_layer'"), std::string::npos);
  std::string no_task = config_to_text(c, t);
  no_task.erase(no_task.find("task=lm"));
  EXPECT_NE(error_of([&] { config_from_text(no_task); }).find("missing key 'task'"), std::string::npos);
  std::string no_option = config_to_text(c, t);
  no_option.erase(no_option.find("lm.train_shards"));
  EXPECT_NE(error_of([&] { config_from_text(no_option); }).find("missing key 'lm.train_shards'"), std::string::npos);
  EXPECT_NE(error_of([&] { config_from_text(config_to_text(c, t) + "dropout=0.1\n"); }).find("unknown key 'dropout'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { config_from_text(config_to_text(c, t) + "vocab=3\n"); }).find("key 'vocab' given twice"),
            std::string::npos);
  std::string bad = config_to_text(c, t);
  bad.replace(bad.find("d_model=32"), 10, "d_model=3x");
  EXPECT_NE(error_of([&] { config_from_text(bad); }).find("d_model expected an integer, got '3x'"), std::string::npos);
  t.lm.data_dir = "two\nlines";
  EXPECT_NE(error_of([&] { config_to_text(c, t); }).find("lm.data_dir holds a line break"), std::string::npos);
}

// A checkpoint is found from the run folder (holding ckpt/) as from the checkpoint folder, and as <dir>.old where
// a save was interrupted between its two renames; a folder without one is refused naming the file it lacks.
TEST(ModelLmCheckpoint, FoundFromTheRunFolderAndAfterAnInterruptedSave) {
  auto run = temp_dir("find");
  torch::manual_seed(1);
  Transformer model(tiny(Mechanism::path));
  torch::optim::AdamW opt(model->parameters());
  TrainerState st;
  st.step = 5;
  save_checkpoint(model, opt, (run / "ckpt").string(), st, TaskConfig{}, "seed=1\n");
  EXPECT_FALSE(fs::exists(run / "ckpt.tmp"));
  EXPECT_FALSE(fs::exists(run / "ckpt.old"));
  for (const auto& p : {run, run / "ckpt"}) {
    EXPECT_TRUE(has_checkpoint(p.string())) << p;
    EXPECT_EQ(checkpoint_dir(p.string()), (run / "ckpt").string()) << p;
  }
  EXPECT_EQ(read_checkpoint_info(run.string()).state.step, 5);
  EXPECT_EQ(read_checkpoint_info(run.string()).data_state, "seed=1\n");
  fs::rename(run / "ckpt", run / "ckpt.old");  // killed between the renames: only the previous checkpoint is left
  for (const auto& p : {run, run / "ckpt"}) {
    EXPECT_TRUE(has_checkpoint(p.string())) << p;
    EXPECT_EQ(read_checkpoint_info(p.string()).dir, (run / "ckpt.old").string()) << p;
  }
  pathattn::model::remove_tree(run / "ckpt.old");
  EXPECT_FALSE(has_checkpoint(run.string()));
  const std::string msg = error_of([&] { read_checkpoint_info(run.string()); });
  EXPECT_NE(msg.find("no checkpoint in '" + run.string() + "': '" + (run / "step.txt").string() + "' not found"),
            std::string::npos)
      << msg;
  pathattn::model::remove_tree(run);
}

// The paper's conversion: a PaTH (or PaTH-FoX) model from a RoPE checkpoint. Every RoPE tensor is copied; the new
// ones are exactly the PaTH layer's own (w projection, its conv, beta; and the gate), left as the layer initialised
// them; nothing is dropped. FoX -> PaTH drops the gate (g_proj weight and bias). Another width is refused naming the
// tensor.
TEST(ModelLmCheckpoint, InitFromRopeCopiesSharedTensorsAndReportsNewOnes) {
  auto dir = temp_dir("init");
  torch::manual_seed(1);
  Transformer rope(tiny(Mechanism::rope));
  torch::optim::AdamW opt(rope->parameters());
  save_checkpoint(rope, opt, (dir / "rope").string(), TrainerState{}, TaskConfig{}, "");
  std::map<std::string, torch::Tensor> src;
  for (const auto& p : rope->named_parameters()) src[p.key()] = p.value();

  for (Mechanism m : {Mechanism::path, Mechanism::path_fox}) {
    torch::manual_seed(2);
    Transformer path(tiny(m));
    std::map<std::string, torch::Tensor> before;
    for (const auto& p : path->named_parameters()) before[p.key()] = p.value().clone();
    const auto r = init_from_checkpoint(path, (dir / "rope").string());
    std::vector<std::string> want_copied, want_fresh;
    for (const auto& [k, v] : src) want_copied.push_back(k);
    for (int l = 0; l < 2; ++l) {
      const std::string b = "block" + std::to_string(l) + ".attn.";
      for (const char* n : {"bt_proj.bias", "bt_proj.weight", "w_conv1d.weight", "w_proj.0.weight", "w_proj.1.weight"})
        want_fresh.push_back(b + n);
      if (m == Mechanism::path_fox) {
        want_fresh.push_back(b + "g_proj.bias");
        want_fresh.push_back(b + "g_proj.weight");
      }
    }
    std::sort(want_fresh.begin(), want_fresh.end());
    EXPECT_EQ(r.copied, want_copied) << mechanism_name(m);
    EXPECT_EQ(r.fresh, want_fresh) << mechanism_name(m);
    EXPECT_TRUE(r.dropped.empty()) << mechanism_name(m);
    for (const auto& p : path->named_parameters()) {
      const auto& want = src.count(p.key()) ? src.at(p.key()) : before.at(p.key());
      EXPECT_TRUE(torch::equal(p.value(), want)) << p.key();
    }
    const std::string text = format_init_report(r, "X");
    EXPECT_NE(text.find("new     block0.attn.bt_proj.weight"), std::string::npos) << text;
  }
  torch::manual_seed(3);
  Transformer fox(tiny(Mechanism::fox));
  save_checkpoint(fox, opt, (dir / "fox").string(), TrainerState{}, TaskConfig{}, "");
  Transformer path(tiny(Mechanism::path));
  const auto r = init_from_checkpoint(path, (dir / "fox").string());
  EXPECT_EQ(r.dropped, (std::vector<std::string>{"block0.attn.g_proj.bias", "block0.attn.g_proj.weight",
                                                 "block1.attn.g_proj.bias", "block1.attn.g_proj.weight"}));
  ModelConfig wide = tiny(Mechanism::path);
  wide.d_model = 64;
  Transformer big(wide);
  const std::string msg = error_of([&] { init_from_checkpoint(big, (dir / "rope").string()); });
  EXPECT_NE(msg.find("block0.attn.k_proj.weight has shape"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { init_from_checkpoint(big, (dir / "none").string()); }).find("no checkpoint"),
            std::string::npos);
  pathattn::model::remove_tree(dir);
}

// Loss by position equals the per-position cross entropy of a direct forward over the same windows, and the CSV
// buckets average it.
TEST(ModelLmEval, LossByPositionMatchesADirectForward) {
  auto d = lm_data("pos");
  lm::TokenStream valid(lm::split_shards(d.string(), "valid"));
  torch::manual_seed(5);
  Transformer model(tiny(Mechanism::path_fox));
  const int64_t L = 40, W = 3;
  const auto pl = loss_by_position(model, valid, L, W, 2, torch::kCPU, Precision::f32);
  ASSERT_EQ(pl.sum.size(), static_cast<size_t>(L));
  const Batch b = even_windows(valid, W, L + 1);
  torch::NoGradGuard ng;
  auto logits = model->forward(b.input);
  auto direct =
      torch::nn::functional::cross_entropy(logits.reshape({-1, (int64_t)kVocab}), b.target.reshape({-1}),
                                           torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
          .reshape({W, L})
          .to(torch::kDouble)
          .sum(0);
  for (int64_t t = 0; t < L; ++t)
    EXPECT_NEAR(pl.sum[t], direct[t].item<double>(), test_tol::kLossByPosition * std::abs(direct[t].item<double>()))
        << t;
  // mean() averages the stored sums exactly (f64); against the direct forward it carries the per-position
  // tolerance: that forward takes the W windows in one batch, loss_by_position 2 at a time, so their f32 GEMMs
  // round differently (1e-9 held only while the two happened to round alike; it failed on a fresh machine).
  double stored = 0;
  for (int64_t t = 0; t < L; ++t) stored += pl.sum[t];
  EXPECT_NEAR(pl.mean(0, L), stored / (W * L), 1e-12);
  EXPECT_NEAR(pl.mean(0, L), direct.sum().item<double>() / (W * L),
              test_tol::kLossByPosition * direct.sum().item<double>() / (W * L));
  auto csv = temp_dir("pos_csv") / "x.csv";
  write_position_csv(pl, 16, csv.string());
  std::ifstream f(csv);
  std::string header, row;
  std::getline(f, header);
  EXPECT_EQ(header, "bucket_start,bucket_end,loss,ppl");
  int rows = 0;
  while (std::getline(f, row)) ++rows;
  EXPECT_EQ(rows, 3);  // [0,16) [16,32) [32,40)
  pathattn::model::remove_tree(csv.parent_path());
  pathattn::model::remove_tree(d);
}
