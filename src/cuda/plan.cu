#include "cuda/plan.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "common/checks.h"
#include "common/env.h"
#include "cuda/bwd_blocks.h"
#include "cuda/check.h"

namespace pathattn::cuda {

std::vector<int32_t> cu_seqlens_to_host(const TensorView& cu, cudaStream_t stream) {
  const int64_t n = cu.sizes[0] - 1;
  std::vector<int32_t> h(static_cast<std::size_t>((n * cu.strides[0]) + 1)), out(static_cast<std::size_t>(n + 1));
  // On the caller's stream, after whatever produced cu_seqlens there.
  CUDA_CHECK(cudaMemcpyAsync(h.data(), cu.data, h.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int64_t i = 0; i <= n; ++i) out[static_cast<std::size_t>(i)] = h[static_cast<std::size_t>(i * cu.strides[0])];
  return out;
}

std::vector<Segment> sequences(const Problem& p, const Inputs& in, void* stream_ptr) {
  if (!p.varlen) {
    std::vector<Segment> s;
    for (int64_t b = 0; b < p.B; ++b) s.push_back({b, 0, p.T});
    return s;
  }
  const std::vector<int32_t> h = cu_seqlens_to_host(in.cu_seqlens, static_cast<cudaStream_t>(stream_ptr));
  const int64_t n = static_cast<int64_t>(h.size()) - 1;
  check_cu_seqlens(h.data(), n, 1, p.T, "");
  std::vector<Segment> s;
  for (int64_t i = 0; i < n; ++i)
    if (h[i + 1] > h[i]) s.push_back({0, h[i], h[i + 1] - h[i]});
  return s;
}

void add_carry_blocks(Plan& plan, int block) {
  plan.carry_block = block;
  plan.blk_of.clear();
  plan.blk_start.clear();
  if (block <= 0) return;
  plan.blk_of.resize(plan.chunks.size());
  for (const SeqInfo& s : plan.seqs)
    for (int i = 0; i < s.count; ++i) {
      if (i % block == 0) plan.blk_start.push_back(s.first + i);
      plan.blk_of[s.first + i] = static_cast<int>(plan.blk_start.size()) - 1;
    }
}

int fwd_block_by_count(int chunks, int group, int D) {
  const double n = chunks, g = group, sweep = 1 + D / 64.0;
  double best_cost = g * (n - 1) / 2;  // per chunk
  int best = 0;
  const double bar = 0.75 * best_cost;
  for (int b = 1; b <= chunks; ++b) {
    const double cost = g * ((b - 1) / 2.0 + n / (2.0 * b)) + sweep;
    if (cost < best_cost) best_cost = cost, best = b;
  }
  return best_cost <= bar ? best : 0;
}

int fwd_block_default(int chunks, int group, int D) {
  if (D == 64 && chunks < 256) return 0;
  return fwd_block_by_count(chunks, group, D);
}

int bwd_block_setting() {
  static const int block = static_cast<int>(env::integer("PATHATTN_BWD_BLOCK", kBwdBlockUnset, -1, 1 << 20));
  return block;
}

int bwd_block_default(int chunks, int D, bool deterministic) {
  if (chunks < 64) return 0;
  if (deterministic) return D == 128 && chunks < 512 ? 4 : 8;
  return chunks < 256 ? 8 : 16;
}

int bwd_block_for(int chunks, int D, int key_block, bool deterministic) {
  const int setting = bwd_block_setting();
  const int block = setting >= 0    ? setting
                    : setting == -1 ? fwd_block_by_count(chunks, 1, D)
                                    : bwd_block_default(chunks, D, deterministic);
  return key_block == 2 && block % 2 == 1 ? block + 1 : block;
}

Plan backward_plan(const std::vector<Segment>& segs, int H, int pair_group, int key_block, int D, bool deterministic) {
  Plan plan = make_plan(segs, H, true, pair_group, key_block);
  add_carry_blocks(plan, bwd_block_for(plan.max_chunks, D, key_block, deterministic));
  return plan;
}

int bwd_slot_chunks(const Plan& plan) {
  if (plan.carry_block <= 0) return plan.max_chunks;
  int most = 1;
  for (const SeqInfo& s : plan.seqs)
    for (int c = s.first; c < s.first + s.count; ++c)
      most = std::max(most, BwdLevels::of(c, s.first, s.first + s.count - 1, plan.carry_block).count());
  return most;
}

bool bwd_blocks_need_mma(int D) {
  const int setting = bwd_block_setting();
  return D == 64 && setting > 0 && setting % 2 == 1;
}

Plan make_plan(const std::vector<Segment>& segs, int H, bool backward, int pair_group, int key_block) {
  Plan pl;
  for (const Segment& s : segs) {
    SeqInfo si{static_cast<int>(pl.chunks.size()), 0};
    for (int64_t c0 = 0; c0 < s.len; c0 += kChunk) {
      pl.chunks.push_back({static_cast<int>(s.b), static_cast<int>(s.t0 + c0),
                           static_cast<int>(std::min<int64_t>(kChunk, s.len - c0)), si.first, 0});
      ++si.count;
    }
    for (int c = si.first; c < si.first + si.count; ++c) pl.chunks[c].last = si.first + si.count - 1;
    pl.seqs.push_back(si);
    pl.max_chunks = std::max(pl.max_chunks, si.count);
  }
  // Forward: sequences longest first, and inside a sequence its query chunks from the last (most key chunks to
  // visit) to the first, so that the CTAs running at one time share their key chunks in L2 and the grid ends on
  // short work. The first schedule (all longest chunks of every sequence and head first) made every resident CTA
  // read different keys: L2 hit rate 5%, DRAM-bound at 3.8 TB/s (ncu, docs/perf/notes.md).
  std::vector<int> by_len(pl.seqs.size());
  for (std::size_t i = 0; i < pl.seqs.size(); ++i) by_len[i] = static_cast<int>(i);
  std::stable_sort(by_len.begin(), by_len.end(), [&](int a, int b) { return pl.seqs[a].count > pl.seqs[b].count; });
  if (!backward)
    for (int si : by_len)
      for (int c = pl.seqs[si].first + pl.seqs[si].count - 1; c >= pl.seqs[si].first; --c) pl.fwd_order.push_back(c);
  if (backward) {
    // Backward: task (c, h) adds to dQ^_m and dP_j of later chunks after task (c + 1, h) did (kernels/bwd_main.cuh:
    // the fixed summation order). A CTA waits only for tasks earlier in this list, which were taken before it and
    // are running or done, so the waits cannot deadlock. (sequence, head) pairs one after the other, longest
    // sequences first, and inside a pair its key chunks from the last (shortest task) to the first: the CTAs
    // running at one time then belong to a few (sequence, head) pairs and share Q^, dO, the chunk steps and the
    // dQ^ / dP accumulators in L2. The first schedule (rank-major: every pair's rank-r task, then rank r + 1) put
    // each resident CTA on a different pair: L2 hit rate 52%, DRAM at 2.5 TB/s (ncu, docs/perf/notes.md). The
    // grid ends on one pair's longest task, under 1% of a CTA's share of the work at T >= 4096.
    //
    // pair_group > 1 interleaves that many consecutive pairs rank by rank (every pair's last chunk, then every
    // pair's second-to-last, ...): task c + 1 then starts pair_group list positions before task c, slack against
    // the ordered turns' waits (v3 measured them at ~30% of the deterministic main kernel), while the resident
    // CTAs still share a few pairs' data in L2. The order rule above holds inside a group.
    std::vector<std::pair<int, int>> pairs;  // (sequence, head)
    for (int si : by_len)
      for (int h = 0; h < H; ++h) pairs.push_back({si, h});
    //
    // key_block = 2 (the two-chunk main kernel): the same order over blocks of two chunks, a block named by its
    // first chunk (the sequence's first, then every second one); a sequence of an odd count ends in a block of one.
    const std::size_t g = static_cast<std::size_t>(std::max(pair_group, 1));
    const int kb = std::max(key_block, 1);
    auto blocks = [&](const SeqInfo& s) { return (s.count + kb - 1) / kb; };
    for (std::size_t p0 = 0; p0 < pairs.size(); p0 += g) {
      const std::size_t p1 = std::min(pairs.size(), p0 + g);
      int ranks = 0;
      for (std::size_t i = p0; i < p1; ++i) ranks = std::max(ranks, blocks(pl.seqs[pairs[i].first]));
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = p0; i < p1; ++i) {
          const SeqInfo& s = pl.seqs[pairs[i].first];
          if (r < blocks(s)) pl.bwd_tasks.push_back((s.first + kb * (blocks(s) - 1 - r)) * H + pairs[i].second);
        }
    }
  }
  return pl;
}

int decode_splits(int64_t B, int64_t H, int64_t Tmax, int sms, int blocks_per_sm) {
  // Two resident split blocks per SM (256 threads, 128 registers), four waves' worth of blocks: short splits
  // even out sequences of different lengths. Each split adds a partial of HQ / H x (D + 2) floats per kv head,
  // small beside its >= 128 rows x 3 x 4 D bytes of cache traffic. With at most one (sequence, kv head) pair per
  // 8 SMs (B = 1 or 2 at H = 8) one full wave instead (rounded down, so that no block waits for a second wave):
  // there each block's fixed cost (its prologue, its partial, the combine's share) outweighs what the later waves
  // even out. Measured on the H200 (twelfth session, f32 cache, B = 1, H 8, through the overrides below): 16k
  // 61.2 -> 41.0 us at D 64 and 98.1 -> 74.2 at D 128, 131k 263 -> 237 and 494 -> 461; at B = 8 one wave was
  // 6-30% slower. The one wave counts the kernel's resident blocks (blocks_per_sm): the tensor-core kernel at D 128
  // holds one block per SM, where 2 x SMs blocks made two waves (thirteenth session: its B = 1 steps were the
  // slowest per byte, 43% of the copy bandwidth at 16k); the four waves stay counted at two blocks per SM, as measured.
  // PATHATTN_DECODE_WAVES, PATHATTN_DECODE_MIN_ROWS and PATHATTN_DECODE_BLOCKS_PER_SM override the waves, the 128
  // and blocks_per_sm, PATHATTN_DECODE_SPLITS the count itself (within the same bounds; read once), for measuring
  // (docs/perf/notes.md "Decode").
  static const int64_t waves_env = env::integer("PATHATTN_DECODE_WAVES", 0, 1);
  static const int64_t min_rows = env::integer("PATHATTN_DECODE_MIN_ROWS", kDecodeMinRows, 1);
  static const int64_t resident_env = env::integer("PATHATTN_DECODE_BLOCKS_PER_SM", 0, 1);
  static const int64_t splits_env = env::integer("PATHATTN_DECODE_SPLITS", 0, 1);
  const int64_t resident = resident_env > 0 ? resident_env : std::max(blocks_per_sm, 1);
  const int64_t pairs = std::max<int64_t>(B * H, 1), sm_count = std::max(sms, 1);
  const bool one_wave = waves_env == 0 && 8 * pairs <= sms;
  int64_t want = one_wave ? resident * sm_count / pairs : 0;
  if (!one_wave) {
    // Of the two split counts around the waves' worth (slots x waves / pairs rounded down and up), the one whose
    // blocks fill their last wave best: a step takes about ceil(blocks / slots) block times, and a block's time is
    // proportional to its rows, L / splits, so the cost of s splits is ceil(pairs s / slots) / s. Rounding up
    // alone (before the thirteenth session) gave B = 8 at H 8 17 splits, 1088 blocks: 4.12 waves, the fifth nearly
    // empty; 16 make 3.88. A tie keeps the larger count (shorter blocks even out unequal lengths better).
    const int64_t slots = 2 * sm_count, blocks = (waves_env > 0 ? waves_env : 4) * slots;
    const int64_t lo = std::max<int64_t>(1, blocks / pairs), hi = (blocks + pairs - 1) / pairs;
    auto waves_up = [&](int64_t splits) { return (pairs * splits + slots - 1) / slots; };
    want = waves_up(lo) * hi < waves_up(hi) * lo ? lo : hi;  // cost(lo) < cost(hi), cross-multiplied
  }
  if (splits_env > 0) want = splits_env;
  const int64_t useful = std::max<int64_t>(1, Tmax / min_rows);
  return static_cast<int>(std::clamp<int64_t>(std::min(want, useful), 1, kDecodeMaxSplits));
}

}  // namespace pathattn::cuda
