#include "cuda/workspace_tables.h"

#include <algorithm>

#include "cuda/params.h"

namespace pathattn::cuda {

SharedBuffers declare_shared(Workspace& ws, const Problem& p, const Plan& plan, bool f32_copies, bool with_m) {
  const std::size_t NC = plan.chunks.size(), rows = NC * p.H * kChunk;
  SharedBuffers b{};
  b.chunks = ws.add("chunks", NC * sizeof(ChunkInfo));
  b.seqs = ws.add("seqs", plan.seqs.size() * sizeof(SeqInfo));
  b.order = ws.add("order", plan.fwd_order.size() * sizeof(int));
  b.khat = ws.add("khat", rows * p.D * 2);
  b.u = ws.add("u", rows * p.D * 2);  // u and w stay adjacent: the backward's dK^ reuses them (declare_backward)
  b.w = ws.add("w", rows * p.D * 2);
  b.m = with_m ? ws.add("m", rows * kChunk * 2) : -1;
  b.step = ws.add("step", NC * p.H * p.D * p.D * 2);
  if (f32_copies) b.f32 = ws.add("f32 khat, u, w", 3 * rows * p.D * 4);
  if (p.has_gate) {
    b.gl = ws.add("gl", NC * p.HQ * kChunk * 4);
    b.goff = ws.add("goff", NC * p.HQ * 8);
    b.gtot = ws.add("gtot", NC * p.HQ * 8);
  }
  return b;
}

FwdBlockBuffers declare_fwd_blocks(Workspace& ws, const Problem& p, const Plan& plan) {
  FwdBlockBuffers b{};
  if (plan.carry_block <= 0) return b;
  const std::size_t NC = plan.chunks.size(), NB = plan.blk_start.size();
  b.tables = ws.add("fwd block tables", (NC + NB) * sizeof(int));
  b.kfar = ws.add("kfar", NC * p.H * kChunk * p.D * 2);
  b.blockstep = ws.add("blockstep", NB * p.H * p.D * p.D * 2);
  return b;
}

BwdBuffers declare_backward(Workspace& ws, const Problem& p, const Plan& plan, const BwdGrid& grid) {
  const int NC = static_cast<int>(plan.chunks.size());
  const int64_t D = p.D;
  const std::size_t q_rows = static_cast<std::size_t>(NC) * p.HQ * kChunk, k_rows = static_cast<std::size_t>(NC) * p.H * kChunk;
  BwdBuffers b{};
  b.shared = declare_shared(ws, p, plan, false, false);
  b.tasks = ws.add("bwd tasks", plan.bwd_tasks.size() * sizeof(int));
  b.qhat = ws.add("qhat", q_rows * D * 2);
  b.lse2 = ws.add("lse2", q_rows * 4);
  b.delta = ws.add("delta", q_rows * 4);
  b.dqacc = ws.add("dqacc", q_rows * D * 4);
  b.dkacc = ws.overlay("dkacc", b.shared.u, b.shared.w, k_rows * D * 4);  // = U and W's bytes (f32 vs 2 x 16 bits)
  b.dvacc = ws.add("dvacc", k_rows * D * 4);
  b.dpacc = ws.add("dpacc", static_cast<std::size_t>(NC) * p.H * D * D * 4);
  b.dgacc = p.has_gate ? ws.add("dgacc", q_rows * 4) : -1;
  b.dgrow = p.has_gate ? ws.add("dgrow", q_rows * 4) : -1;
  b.count_q = ws.add("count_q", static_cast<std::size_t>(NC) * p.HQ * 4);
  b.count_p = ws.add("count_p", static_cast<std::size_t>(NC) * p.H * 4);
  b.next_task = ws.add("next_task", 4);
  b.dohat = main_reads_dohat(grid) ? ws.add("dohat", q_rows * D * 2) : -1;
  b.slots = ws.add("slots", static_cast<std::size_t>(main_slots(grid)) * bwd_slot_chunks(plan) * kChunk * D * 2);
  b.local = ws.overlay("local scratch", b.slots, b.slots,
                       static_cast<std::size_t>(grid.local_ctas) * kLocalTiles * kChunk * D * 4);
  if (plan.carry_block > 0) {
    const std::size_t NB = plan.blk_start.size();
    b.blk_tables = ws.add("bwd block tables", (NC + NB) * sizeof(int));
    b.sprefix = ws.add("sprefix", static_cast<std::size_t>(NC) * p.H * D * D * 2);
    b.qfar = ws.add("qfar", q_rows * D * 2);
    b.dqfar = ws.add("dqfar", q_rows * D * 4);
    b.blockstep = ws.add("bwd blockstep", NB * p.H * D * D * 2);
    b.dpiacc = ws.add("dpiacc", NB * p.H * D * D * 4);
    b.count_pi = ws.add("count_pi", NB * p.H * 4);
  }
  return b;
}

BwdGrid backward_grid_for(const BwdGrid& resident, const Problem& p, const Plan& plan) {
  BwdGrid grid = resident;
  if (grid.wide_main && grid.mma_ctas_for_blocks > 0 && plan.carry_block > 0) {  // (launch.h)
    grid.wide_main = false;
    grid.main_ctas = grid.mma_ctas_for_blocks;
  }
  grid.mma_ctas_for_blocks = 0;
  grid.main_ctas = std::min(grid.main_ctas, static_cast<int>(plan.bwd_tasks.size()));
  grid.local_ctas = std::min(grid.local_ctas, static_cast<int>(plan.chunks.size() * p.H));
  return grid;
}

}  // namespace pathattn::cuda
