// The workspace tables of the forward and the backward: which scratch buffers a call declares (workspace.h), their
// sizes, and which of them share memory. Host arithmetic only (api.cu backs and fills them), so their sizes are
// tested without a GPU (tests/cuda/test_cuda_workspace_tables.cpp).
#pragma once

#include "cuda/launch/launch.h"
#include "cuda/plan.h"
#include "cuda/workspace.h"
#include "pathattn/pathattn.h"

namespace pathattn::cuda {

// The workspace buffers that forward and backward share: the plan's tables and the chunk factors.
struct SharedBuffers {
  int chunks, seqs, order, khat, u, w, m, step, f32 = -1, gl = -1, goff = -1, gtot = -1;
};
// f32_copies: the key cache's f32 copies of K^, U, W (the forward with a key cache output).
// with_m: the forward's main kernel reads the chunks' M (Eq. 12); the backward recomputes it in bwd_local.
SharedBuffers declare_shared(Workspace& ws, const Problem& p, const Plan& plan, bool f32_copies, bool with_m);

// The two-level forward's buffers (plan.carry_block > 0; else every id is -1): the block tables (blk_of then
// blk_start, one int array), K' like K^, and one D x D step per block and kv head.
struct FwdBlockBuffers {
  int tables = -1, kfar = -1, blockstep = -1;
};
FwdBlockBuffers declare_fwd_blocks(Workspace& ws, const Problem& p, const Plan& plan);

// The backward's workspace table beyond the shared buffers (ids into the Workspace).
struct BwdBuffers {
  SharedBuffers shared;
  int tasks, qhat, lse2, delta, dqacc, dkacc, dvacc, dpacc, dgacc, dgrow;
  int count_q, count_p, next_task, dohat, slots, local;
  // The two-level backward (plan.carry_block > 0; else -1): the block tables as the forward's, and BwdParams'
  // sprefix, qfar, dqfar, blockstep, dpiacc, count_pi.
  int blk_tables = -1, sprefix = -1, qfar = -1, dqfar = -1, blockstep = -1, dpiacc = -1, count_pi = -1;
};
// Two pairs of buffers whose lives do not overlap share memory (Workspace::overlay), in the order the stages run
// (prep, bwd_prep, bwd_main, bwd_local; launch/bwd_impl.cuh, one stream):
//   dkacc in U and W: U and W are read last by bwd_prep; bwd_main writes every chunk's dK^ once, at the end of the
//     chunk's task (a plain store, nothing zeroes or adds to it before), and bwd_local reads it;
//   the local scratch in the slots: the slots live inside bwd_main, the local scratch inside bwd_local.
// Together ~90 MB of the 1.05 GB a 2-kv-head slice took at 8 x 16384, D 64 (docs/perf/notes.md).
BwdBuffers declare_backward(Workspace& ws, const Problem& p, const Plan& plan, const BwdGrid& grid);

// The launch grid of a backward over p's heads with this plan, which sizes its slots and scratch: `resident` (the
// CTAs that fit the device, the same for every slice of a call) capped by the plan's tasks; the D = 128
// deterministic mode's switch to the mma.sync kernel when the plan has blocks (BwdGrid::mma_ctas_for_blocks).
BwdGrid backward_grid_for(const BwdGrid& resident, const Problem& p, const Plan& plan);

}  // namespace pathattn::cuda
