// The CUDA backend's workspace tables (src/cuda/workspace_tables.h): which buffers share memory, and what the
// backward's scratch comes to at the memory shape. Host arithmetic only (no memory is acquired), so label
// cpu: it runs in CI. The grid is the one the H100 and H200 give at D = 64 (132 SMs: one bwd_main_pair CTA of two
// slots and one bwd_local CTA per SM, docs/perf/results.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/head_slices.h"
#include "cuda/workspace_tables.h"

namespace pathattn::cuda {
namespace {

constexpr int kSms = 132;

BwdGrid pair_grid() {
  BwdGrid g;
  g.main_ctas = kSms;
  g.local_ctas = kSms;
  g.pair_main = true;
  return g;
}

Problem problem(int64_t B, int64_t T, int64_t H, int64_t HQ, int64_t D, bool gate) {
  Problem p;
  p.B = B;
  p.T = T;
  p.H = H;
  p.HQ = HQ;
  p.group = HQ / H;
  p.D = p.DV = D;
  p.has_gate = gate;
  p.device = Device::cuda;
  p.dtype = DType::bf16;
  for (int64_t b = 0; b < B; ++b) p.segments.push_back({b, 0, T});
  return p;
}

// What api.cu's backward declares for a call over these heads in the deterministic mode, the default (its plan and
// grid, as backward_heads makes them; the pair kernel's blocks of two key chunks, and the two-level backward's blocks
// where plan.h's default turns them on).
struct Table {
  Workspace ws;
  BwdBuffers b;
  Table(const Problem& p, const BwdGrid& grid) {
    const Plan plan =
        backward_plan(p.segments, static_cast<int>(p.H), bwd_pair_group(p.T), 2, static_cast<int>(p.D), true);
    b = declare_backward(ws, p, plan, backward_grid_for(grid, p, plan));
  }
};

TEST(CudaWorkspace, OverlayReusesTheEntriesWhenItFitsElseAddsMemory) {
  Workspace ws;
  const int a = ws.add("a", 1000), b = ws.add("b", 1000), c = ws.add("c", 500);
  const std::size_t total = ws.total();
  EXPECT_EQ(total, 1024u + 1024u + 512u);
  const int x = ws.overlay("x", a, b, 2000);  // 2000 <= 1024 + 1000
  EXPECT_EQ(ws.total(), total);
  EXPECT_TRUE(ws.overlaps(x, a));
  EXPECT_TRUE(ws.overlaps(x, b));
  EXPECT_FALSE(ws.overlaps(x, c));
  const int y = ws.overlay("y", c, c, 513);  // more than c holds: its own memory
  EXPECT_EQ(ws.total(), total + 768u);
  EXPECT_FALSE(ws.overlaps(y, c));
  EXPECT_FALSE(ws.overlaps(y, a));
  EXPECT_THROW(ws.overlay("z", b, a, 10), Error);
}

// dK^ lives in U and W's memory, the local scratch in the slots', and nothing else shares memory: every buffer that
// a stage reads or writes while another is live has its own.
TEST(CudaWorkspace, BackwardSharesOnlyBuffersWhoseLivesDoNotOverlap) {
  for (bool gate : {false, true}) {
    Table t(problem(2, 4096, 2, 4, 64, gate), pair_grid());
    const BwdBuffers& b = t.b;
    const SharedBuffers& s = b.shared;
    EXPECT_TRUE(t.ws.overlaps(b.dkacc, s.u));
    EXPECT_TRUE(t.ws.overlaps(b.dkacc, s.w));
    EXPECT_TRUE(t.ws.overlaps(b.local, b.slots));
    std::vector<int> ids = {s.chunks, s.seqs, s.order, s.khat, s.step, b.tasks, b.qhat, b.lse2, b.delta, b.dqacc,
                            b.dvacc, b.dpacc, b.count_q, b.count_p, b.next_task, b.dohat, b.slots};
    if (gate) ids.insert(ids.end(), {s.gl, s.goff, s.gtot, b.dgacc, b.dgrow});
    for (int id : ids) {
      EXPECT_FALSE(t.ws.overlaps(b.dkacc, id)) << "dkacc and entry " << id;
      if (id != b.slots) EXPECT_FALSE(t.ws.overlaps(b.local, id)) << "local scratch and entry " << id;
    }
    for (size_t i = 0; i < ids.size(); ++i)
      for (size_t j = i + 1; j < ids.size(); ++j) EXPECT_FALSE(t.ws.overlaps(ids[i], ids[j])) << ids[i] << ", " << ids[j];
  }
}

// The two-level backward (plan.carry_block > 0) declares its own buffers beside the others, sized by chunks, blocks and
// heads; without blocks none (every id -1).
TEST(CudaWorkspace, BackwardBlockBuffersOnlyWithBlocks) {
  const Problem p = problem(2, 1000, 2, 4, 64, true);  // 16 chunks per sequence
  EXPECT_EQ(Table(p, pair_grid()).b.qfar, -1);
  Workspace ws;
  BwdGrid grid = pair_grid();
  grid.pair_main = false;  // blocks run the mma.sync main kernel
  Plan plan = make_plan(p.segments, static_cast<int>(p.H), true, 1, 1);
  add_carry_blocks(plan, 3);  // 6 blocks per sequence: 12
  const BwdBuffers b = declare_backward(ws, p, plan, backward_grid_for(grid, p, plan));
  const std::size_t NC = 32, NB = 12, D = 64, q_rows = NC * 4 * 64;
  EXPECT_EQ(ws.bytes(b.blk_tables), (NC + NB) * 4);
  EXPECT_EQ(ws.bytes(b.sprefix), NC * 2 * D * D * 2);
  EXPECT_EQ(ws.bytes(b.qfar), q_rows * D * 2);
  EXPECT_EQ(ws.bytes(b.dqfar), q_rows * D * 4);
  EXPECT_EQ(ws.bytes(b.blockstep), NB * 2 * D * D * 2);
  EXPECT_EQ(ws.bytes(b.dpiacc), NB * 2 * D * D * 4);
  EXPECT_EQ(ws.bytes(b.count_pi), NB * 2 * 4);
  for (int id : {b.blk_tables, b.sprefix, b.qfar, b.dqfar, b.blockstep, b.dpiacc, b.count_pi})
    for (int other : {b.dqacc, b.dpacc, b.slots, b.local, b.dkacc, b.shared.step})
      EXPECT_FALSE(ws.overlaps(id, other)) << id << ", " << other;
}

// D = 128 in the deterministic mode (launch.h BwdGrid::mma_ctas_for_blocks): a plan with blocks runs the mma.sync
// main kernel (one slot per CTA, no dO^ tiles), one without keeps the wide kernel; the switch is spent either way.
TEST(CudaWorkspace, DeterministicD128SwitchesToTheMmaKernelWithBlocks) {
  BwdGrid resident;
  resident.main_ctas = kSms;
  resident.local_ctas = 2 * kSms;
  resident.wide_main = true;
  resident.mma_ctas_for_blocks = 2 * kSms;
  const Problem p = problem(2, 4096, 4, 4, 128, false);  // 64 chunks per sequence
  Plan plan = make_plan(p.segments, static_cast<int>(p.H), true, 1, 1);
  const BwdGrid off = backward_grid_for(resident, p, plan);
  EXPECT_TRUE(off.wide_main);
  EXPECT_EQ(off.main_ctas, kSms);
  EXPECT_EQ(off.mma_ctas_for_blocks, 0);
  add_carry_blocks(plan, 8);
  const BwdGrid on = backward_grid_for(resident, p, plan);
  EXPECT_FALSE(on.wide_main);
  EXPECT_FALSE(main_reads_dohat(on));
  EXPECT_EQ(on.main_ctas, 2 * kSms);
  EXPECT_EQ(on.mma_ctas_for_blocks, 0);
  resident.mma_ctas_for_blocks = 0;  // the fast mode, or PATHATTN_BWD_MAIN=wgmma: no switch
  EXPECT_TRUE(backward_grid_for(resident, p, plan).wide_main);
}

// When the slots are smaller than the local scratch (one chunk per sequence: one slot row block per warpgroup), the
// local scratch gets memory of its own.
TEST(CudaWorkspace, LocalScratchOutgrowingTheSlotsGetsItsOwnMemory) {
  Table t(problem(4, 10, 2, 4, 64, false), pair_grid());
  EXPECT_FALSE(t.ws.overlaps(t.b.local, t.b.slots));
  EXPECT_TRUE(t.ws.overlaps(t.b.dkacc, t.b.shared.u));
}

// Issue 9's memory goal: the backward's extra memory under 1 GB at B 8, T 16384, H 32, D 64. With the default limit
// (1 GiB) a call runs over slices of kv heads (api.cu backward, common/head_slices.h); each slice's scratch is the
// backward's extra peak. Measured before the overlays (tenth session): 2 kv heads per slice, 1.049 GB. With the
// two-level backward (on by default from 64 chunks) its Q' and dQ' buffers came beside the rest: one kv head per
// slice, 0.829 GB (bench_fwd's "bwd ws GB" on the H100, thirty-first session: 0.829); then the slots sized by the
// task's levels (plan.h bwd_slot_chunks: 38 instead of 256 C x D tiles per slot) took 3 kv heads per slice, 0.910 GB.
TEST(CudaWorkspace, EightBy16kBackwardScratchUnderOneGB) {
  const Problem p = problem(8, 16384, 32, 32, 64, false);
  const auto bytes = [&](int64_t n) {
    Table t(slice_problem(p, {0, n}), pair_grid());
    return t.ws.total();
  };
  const std::size_t limit = std::size_t{1} << 30;
  const int64_t per_slice = heads_per_slice(p.H, limit, bytes);
  std::printf("8 x 16384, H 32, D 64: %lld kv heads per slice, %.3f GB each (1 kv head: %.3f GB)\n",
              static_cast<long long>(per_slice), bytes(per_slice) / 1e9, bytes(1) / 1e9);
  EXPECT_EQ(per_slice, 3);
  EXPECT_LT(bytes(per_slice), std::size_t{1000000000});
}

// At 32 x 4096 (the same chunks per kv head, a quarter of the slots) the shared buffers let a slice hold 4 kv heads
// instead of 3 (8 calls instead of 11, each slice's call ending in a tail of its own; docs/cuda.md, "Workspace
// limit"); the two-level backward's buffers (on by default at 64 chunks) take it back to 3 (0.966 GB; bench_fwd
// measured 0.966 on the H100, thirty-first session), 0.858 GB with the slots sized by the task's levels.
TEST(CudaWorkspace, ThirtyTwoBy4kBackwardSlicesOfFourHeads) {
  const Problem p = problem(32, 4096, 32, 32, 64, false);
  const auto bytes = [&](int64_t n) {
    Table t(slice_problem(p, {0, n}), pair_grid());
    return t.ws.total();
  };
  const int64_t per_slice = heads_per_slice(p.H, std::size_t{1} << 30, bytes);
  std::printf("32 x 4096, H 32, D 64: %lld kv heads per slice, %.3f GB each\n", static_cast<long long>(per_slice),
              bytes(per_slice) / 1e9);
  EXPECT_EQ(per_slice, 3);
}

}  // namespace
}  // namespace pathattn::cuda
