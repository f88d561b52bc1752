// Kernel launchers, one per stage, each instantiated for the dtypes and head dimensions in its launch/*.cu.
// dispatch.cu picks the instance; nothing else includes the kernels.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "cuda/params.h"

namespace pathattn::cuda {

void launch_gate(const FwdParams& p, cudaStream_t stream);
template <typename T, int D>
void launch_prep(const FwdParams& p, cudaStream_t stream);
template <typename T, int D>
void launch_prep_tc(const FwdParams& p, cudaStream_t stream);
template <typename T, int D, bool kGate>
void launch_fwd(const FwdParams& p, cudaStream_t stream);
template <typename T, int D>
void launch_fwd_block_carry(const FwdParams& p, cudaStream_t stream);
// Whether env PATHATTN_FWD128 names the D = 128 forward kernel `name` ("onee", the default; "twoe"; "mma").
bool fwd128_is(const char* name);
template <typename T, int D>
void launch_kcache(const FwdParams& p, cudaStream_t stream);

// The backward's persistent grids: CTAs resident at once (each owns a scratch slot).
struct BwdGrid {
  int main_ctas = 0, local_ctas = 0;
  bool pair_main = false;  // the main kernel is bwd_main_pair (D = 64, wgmma; needs BwdParams::dohat): tasks are
                           // blocks of two key chunks (plan.h key_block), two slots per CTA
  bool wide_main = false;  // the main kernel is bwd_main_wide (D = 128, wgmma; needs BwdParams::dohat): one key
                           // chunk per task, one slot per CTA
  // With wide_main in the deterministic mode: the mma.sync kernel's resident CTAs, for the calls whose plan has
  // blocks (backward_grid_for switches to it: there it is faster, workspace_tables.h); 0 = no switch.
  int mma_ctas_for_blocks = 0;
};
// Whether the main kernel reads dO in chunk tiles (BwdParams::dohat, written by bwd_prep): the wgmma ones.
inline bool main_reads_dohat(const BwdGrid& g) { return g.pair_main || g.wide_main; }
// Key chunks per main-kernel task (plan.h make_plan's key_block): two in bwd_main_pair, else one.
inline int main_key_block(const BwdGrid& g) { return g.pair_main ? 2 : 1; }
// The main kernel's slots (BwdParams::slots): one per CTA, one per warpgroup of bwd_main_pair.
inline int main_slots(const BwdGrid& g) { return g.main_ctas * (g.pair_main ? 2 : 1); }
template <typename T, int D, bool kGate, bool kDet>
BwdGrid bwd_grid(int group);
// bwd_prep, bwd_main, bwd_local, and the gate's reverse cumulative sum; the UT preprocess and the gate
// cumulation run before (dispatch.cu).
// mark(stage) after each stage: dispatch.cu's PATHATTN_CUDA_PROFILE timer.
using StageMark = std::function<void(const char*)>;
template <typename T, int D, bool kGate, bool kDet>
void launch_bwd(const BwdParams& p, const BwdGrid& grid, cudaStream_t stream, const StageMark& mark);
void launch_bwd_gate(const BwdParams& p, cudaStream_t stream);

}  // namespace pathattn::cuda
