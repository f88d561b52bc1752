// The main backward kernel at D = 64 on wgmma (PATHATTN_BWD_MAIN=mma runs bwd_main.cuh's mma.sync kernel instead):
// the math and the per-chunk steps of bwd_main.cuh (docs/math.md Eq. 18-23, 33) with two key chunks per task: one
// task = (key block c0, c0 + 1, kv head h) and one CTA = two warpgroups, warpgroup w owning key chunk c0 + w (its
// rows 16 (warp % 4)..).
//
// Every product is m64n64k16 x 4 (k = 64) or x 8 (k = 128) with A from registers (the accumulator layout per warp is
// mma.sync's, so results become A operands in place, and ldmatrix gives the transposed ones) and B from a
// 128-byte-swizzled shared tile (wgmma.cuh). Why wgmma: the mma.sync kernel reads each B tile once per warp through
// ldmatrix (4x per warpgroup) and issues ~5x more instructions per product (notes.md backward v4: its products
// then run at ~390 TFLOP/s). Why two key chunks (notes.md v4, v8, v10): with one chunk per task half of the fast
// mode's time was the two f32 atomic streams, a 64 x 64 tile of dQ^_m per (query chunk, key chunk) pair and a D x D
// tile of dP_j per (chunk j, key chunk) pair, and the deterministic mode's ordered turns added as much again. Here
// both chunks' contributions are summed on the tensor cores before one atomic tile goes out, so the additions and
// the turns are halved, and the two chunks share every Q^, dO^ and E_m tile load. Measured (v10): 5-6% faster than
// one chunk per task at 32 x 4096, 6-12% at 8 x 16384, far less than the halved additions promised, because a
// tail's latency, not the additions' throughput, was what they cost:
//
//   phase 1, m = c0+1 .. last: each warpgroup carries its K^ (warpgroup 1 from m = c0+2), E_m shared
//   phase 2, m = last .. c0+1, every query head of the group (warpgroup 1 idle at m = c0 + 1, its diagonal):
//     each warpgroup:  S^T, dP^T, softmax backward, dV += P^T dO, E += dS^T Q^, dS^T -> shared memory
//     one warpgroup:   dQ^_m += dS_0 K~_{c0,m} + dS_1 K~_{c0+1,m}  (k = 128), one atomic tile
//   chain (m > c0 + 1):
//     one warpgroup:   dP_{m-1} += E_0^T K~_{c0,m-1} + E_1^T K~_{c0+1,m-1}  (k = 128; E_1 only while m-1 > c0+1)
//     each warpgroup:  E <- E + E E_{m-1}^T  (warpgroup 1 until m = c0 + 3)
//
// Two-level (p.carry_block = B > 0, even; docs/math.md Eq. 54-57, cuda/bwd_blocks.h, as in bwd_main.cuh): the
// loops above run over c0's levels instead of chunks: the chunks of c0's own block, then one level per later block
// mu, whose query chunks each meet K~_{.,s_mu} (the level's slot entry) with Q'_m (tm_qfar) and add dQ'_m to
// p.dqfar; the level's step is F_mu (tm_bstep) and the chain step's gradient goes to dPi_mu (p.dpiacc, turns
// p.count_pi). Both chunks of a task lie in one block (B even, tasks start at even offsets), so warpgroup 1's level
// i is warpgroup 0's i + 1. With blocks off every level is one chunk: the loops are the per-chunk ones.
//
// Synchronisation: one CTA barrier per (query chunk, head) step after both warpgroups have stored dS^T and
// finished their dV / E products (the stage's Q^ and dO^ may then be reloaded). The step's dQ^ product and its
// addition (the "tail") go to the warpgroups in turn, step it to warpgroup it % 2, while the other starts step
// it + 1 and issues its copies (it is the first to reach the step's start): each warpgroup runs the tail every
// other step, so one tail's latency hides behind the other warpgroup's products. (A first version gave every tail
// to warpgroup 0: 44.5 -> 44.4 ms in the fast mode at 32 x 4096, no gain from the halved additions, since the
// tail stayed on one warpgroup's critical path.) dS^T tiles and the gate's row sums are double-buffered by stage
// for that reason. One CTA barrier per chain step (E through shared memory); its dP_j products and addition go to
// the warpgroup that did not run the last step's dQ^ products, and the one that did adds that dQ^ tile only now,
// beside them (v19: the two additions, with their turns, run at the same time instead of one after the other on one
// warpgroup while the other waited at the chain's barrier); the latter, done first, issues the next step's copies. The turns
// of the deterministic mode are taken warp by warp (warp_wait_turn below), in the order of the task list (plan.cu:
// blocks of a (sequence, head) pair from the last to the first): block c0 adds to dQ^_m after the (m - 1 - c0) / 2
// blocks that start above it, to dP_j after (j - 1 - c0) / 2; and passed late, at the warp's next step's products
// (defer_pass below: the fence before a pass was most of what the turns cost).
//
// Loads: Q^ and dO^ (bwd_prep's padded chunk tiles, so rows past a chunk's end are zeros and every tile is a plain
// 2-D box), lse2, delta and the gate rows of the next (query chunk, head) step go by TMA into the other of two stages
// while the current step computes; K~_{.,m-1} (the slots) and E_{m-1} for the chain step are issued at the start of
// step m. One thread issues every copy; each completes on an mbarrier.
#pragma once

#include "cuda/kernels/bwd_softmax.cuh"
#include "cuda/kernels/tma.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace pathattn::cuda {

// Shared memory: ten swizzled 64 x 64 tiles of 16-bit elements (8 KB, 1024-byte aligned):
//   2w, 2w + 1: K~ of warpgroup w (current, next)    4 + 2s: Q^ of stage s    5 + 2s: dO^ of stage s
//   8, 9: E steps (phase 1: E_{m+1} ahead; phase 2: the chain's E_{m-1}, alternating)
// then padded [C][LDP] tiles read by ldmatrix: dS^T of warpgroup w and stage s (4), and per warpgroup V at the
// task's start, then E for the chain step (2); then floats and the mbarriers.
struct BwdPairSmem {
  static constexpr int C = kChunk, LDP = 64 + 8;
  static constexpr int kTile = C * 64;
  static constexpr int kSwzHalves = 10 * kTile;
  static constexpr int kPadHalves = 6 * C * LDP;
  // per stage: lse2, delta, query gate, key gate of chunk c0, of c0 + 1 [C] each (5 C); row sums [2 stages][8 warps][C]
  static constexpr int kFloats = 2 * 5 * C + 2 * 8 * C;
  // Bytes after the aligned base: the tiles, the floats, the mbarriers.
  static constexpr int used(int group, bool gate) {
    return (kSwzHalves + kPadHalves) * 2 + (kFloats + (gate ? 2 * group * C : 0)) * 4 + 5 * 8;
  }
  // The turns' bulk form (kBulk): per warpgroup two staging buffers, each a C x 64 f32 tile (two 32-column boxes in
  // the 128-byte swizzle, 1024-byte aligned) and C floats of the gate's row sums, after the rest.
  static constexpr int kStageTile = C * 64 * 4, kStageRows = C * 4;
  static constexpr int stage_offset(int group, bool gate) { return (used(group, gate) + 1023) / 1024 * 1024; }
  // The atomic deterministic form's stash (one C x 64 f32 tile, the kernel's `stash`) at the same offset.
  static constexpr int bytes(int group, bool gate, bool det, bool bulk) {
    return 1024 + (bulk  ? stage_offset(group, gate) + 4 * (kStageTile + kStageRows)
                   : det ? stage_offset(group, gate) + kStageTile
                         : used(group, gate));
  }
};

// The bulk form's tensor maps (kBulk; f32, 32-column boxes in the 128-byte swizzle, tensor_map_2d_f32): dQ^, dQ', dP
// and dPi as [rows, D] matrices, in boxes of a warp's 16 rows here and of a warpgroup's 64 in bwd_main_wide.cuh.
// Without kBulk never read.
struct BwdTurnMaps {
  CUtensorMap dq, dqfar, dp, dpi;
};

namespace bwd_detail {
// The ordered turns of the deterministic mode (bwd_tiles.cuh wait_turn / pass_turn) per warp: the warps of the
// warpgroup that adds a tile each add their own 16 rows, so each waits until the counter shows every warp of the
// blocks before it (4 per block: target 4 x turn) and adds 1 when its own additions are done. No barrier among the
// warpgroup's threads is needed, so the two warpgroups never wait for each other's turns. (A first version took
// the turn per warpgroup with named barriers, bar.sync id, 128: racecheck then reported hazards, on shared tiles
// and even between take_task's two __syncthreads; without named barriers there is nothing for it to mismatch.)
// The spin is warp-uniform (every lane loads, lane 0's value decides): a loop that lane 0 ran alone was a divergent
// path before the next wgmma, and ptxas then serialised every wgmma of the kernel (warning C7520: "wgmma.mma_async
// instructions are serialized due to program dependence on compiler-inserted WG.AR in divergent path"), which cost
// 10-16% of bwd_main (docs/perf/notes.md v11).
// warps: the warps of each task that add (4 here; 8 in bwd_main_wide.cuh, whose two warpgroups both add).
__device__ __forceinline__ void warp_wait_turn(const int* counter, int turn, int warps) {
  while (__shfl_sync(0xffffffffu, load_acquire(counter), 0) < warps * turn) __nanosleep(32);
  __syncwarp();
}

// The turns' passes, deferred (both wgmma main kernels): a warp that has added a tile in its turn passes the turn
// (its fence, then the counter) at its next flush point, after its next products are issued, not right after the
// additions. The fence waits until the warp's additions are done at L2 (~1-2 us); right after them it stalled the
// adding warps, and through the step's barrier the whole CTA, at every step: 13 of the 21 ms that the turns cost
// the two-chunk kernel at 32 x 4096 (PATHATTN_BWD_TIMING_SKIP=512, docs/perf/notes.md). A warp holds (by default) two
// passes, a step's dQ^ tile and the chain step's dP_j right after it, and one fence then serves both. The order of
// every sum is unchanged (the next block still adds after the pass). A warp may wait for a turn while it holds
// passes: a block waits only for blocks above it in its pair (taken earlier, running), and those never wait for
// it, so no wait closes a cycle; each counter is waited for once per task, and a task ends with a flush.
// How many passes a warp may hold is BwdParams::held_passes (2, measured; 3 or 4 by PATHATTN_BWD_HELD, opt-in: 3
// measured level with 2 at D = 64, 4 unrun; the fences' cost follows their number, docs/perf/notes.md, but a pass
// held longer may become what the block below waits for; passing each turn at once, branch held1, measured -10% at
// D = 128 with blocks of 8, nothing with the default blocks of 4, +3% at D = 64: not kept). At a step's start the
// warp flushes once it holds held_passes - 1 (with 2: whatever it holds, as measured), and before taking a pass when
// it holds held_passes.
// HeldPasses: this warp's kMaxHeld slots in shared memory, which only lane 0 reads and writes, and their count n,
// which every lane keeps alike (set and changed only under warp-uniform conditions, so that the branches on it are
// warp-uniform for ptxas: a branch it could not prove uniform before a wgmma serialised them, C7520).
constexpr int kMaxHeld = 4;
struct HeldPasses {
  int** slots;
  int n;
};
// Passes every held turn with one fence (TurnFence, bwd_tiles.cuh; kNone: timing only) if the warp holds at least
// `at_least` (>= 1) of them.
// kBulk: the tiles went out as bulk reductions issued by lane 0 (bulk_turn_add below), so lane 0 alone waits for
// them to complete, orders them before its generic accesses, fences and passes; the warp's other lanes have added
// nothing to global memory and do not fence.
template <bool kBulk = false>
__device__ __forceinline__ void flush_passes(HeldPasses& h, TurnFence fence, int at_least = 1) {
  if (h.n == 0 || h.n < at_least) return;
  if constexpr (kBulk) {
    if (threadIdx.x % 32 == 0) {
      if (fence != TurnFence::kNone) {
        bulk_wait_group<0>();
        fence_proxy_async_global();
      }
      turn_fence(fence);
      for (int i = 0; i < h.n; ++i) atomicAdd(h.slots[i], 1);
    }
  } else {
    turn_fence(fence);
    __syncwarp();
    if (threadIdx.x % 32 == 0)
      for (int i = 0; i < h.n; ++i) atomicAdd(h.slots[i], 1);
  }
  h.n = 0;
  __syncwarp();
}
template <bool kBulk = false>
__device__ __forceinline__ void defer_pass(HeldPasses& h, int* counter, TurnFence fence, int max_held) {
  if (h.n >= max_held) flush_passes<kBulk>(h, fence);
  if (threadIdx.x % 32 == 0) h.slots[h.n] = counter;
  ++h.n;
}
// Stages 64 columns of a warpgroup's C-row f32 accumulator tile (n tiles kFrom .. kFrom + 7 of acc; this warp's
// rows row0.., rows >= `rows` as zeros) in shared memory as two 32-column boxes in the 128-byte swizzle, the layout
// of a 64 x 32 box of tensor_map_2d_f32 there: row r's 16-byte chunk j of a box sits at chunk j ^ (r % 8). A warp's
// float2 stores then meet every bank twice (two wavefronts, the least for 256 bytes); in a plain row-major tile its
// eight rows would share the same banks. The second box starts box_stride floats after the first (C x 32 when the
// two are adjacent; each 1024-byte aligned).
template <int kFrom = 0, int N>
__device__ __forceinline__ void stage_acc_swz(const float (&acc)[N][4], float* tile, int box_stride, int row0, int rows) {
  static_assert(kFrom + 8 <= N, "64 columns of the accumulator");
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = row0 + g + 8 * hh;
      float* dst = tile + (nt / 4) * box_stride + swz128_in_box<4>(r, (nt % 4) * 8 + 2 * t4);  // box nt / 4
      const bool in = r < rows;
      *reinterpret_cast<float2*>(dst) =
          make_float2(in ? acc[kFrom + nt][2 * hh] : 0.f, in ? acc[kFrom + nt][2 * hh + 1] : 0.f);
    }
}
// Lane 0 of an adding warp, in its turn: a staged 64-column tile (stage_acc_swz) added to map's rows y..,
// columns x0 .. x0 + 63 as two bulk tensor reductions (the copy engine's f32 adds at L2), in the current bulk group;
// tile points at the first box's first row that map's box covers (a warp's 16 rows, or a warpgroup's 64).
__device__ __forceinline__ void reduce_staged_tile(const CUtensorMap* map, int x0, int y, const float* tile, int box_stride) {
  tma_reduce_add_2d(map, x0, y, smem_addr(tile));
  tma_reduce_add_2d(map, x0 + 32, y, smem_addr(tile + box_stride));
}
}  // namespace bwd_detail

// Warp-uniform forms (no wgmma serialised by ptxas, C7520): the warpgroup index comes through a shuffle from lane 0
// and the turns spin on every lane (warp_wait_turn), so that the role branches and the turns are no divergent paths
// before a wgmma (ptxas: 253-255 registers, 8-76 bytes of spill). Measured on the H200 against the serialised form
// (docs/perf/notes.md v11): bwd_main det / fast 62.3 / 41.9 -> 56.2 / 35.0 ms at 32 x 4096, 250.0 / 170.0 -> 224.6 /
// 142.0 at 8 x 16384. (The fast mode's tails by bulk reductions instead of float4 atomics, a per-warp form of the
// one-chunk kernel's, were slower here: 35.0 -> 37.1 and 142.0 -> 149.8 ms; removed.)
template <typename T, bool kGate, bool kDet, bool kBlocks, bool kBulk = false>
__global__ void __launch_bounds__(256, 1)
    bwd_main_pair_kernel(const BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_step,
                         const __grid_constant__ CUtensorMap tm_slot, const __grid_constant__ CUtensorMap tm_qfar,
                         const __grid_constant__ CUtensorMap tm_bstep, const __grid_constant__ BwdTurnMaps tmaps) {
  using namespace fwd_detail;
  using namespace bwd_detail;
  using S = BwdPairSmem;
  static_assert(kDet || !kBulk, "the bulk form is the deterministic turns'");
  constexpr int D = 64, C = kChunk, LDP = S::LDP;
  constexpr int NT = D / 8, KD = D / 16, NC8 = C / 8, KC = C / 16;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  T* sm = reinterpret_cast<T*>(smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u));
  auto tile = [&](int i) { return sm + i * S::kTile; };
  T* pad = sm + S::kSwzHalves;
  auto sDS = [&](int w, int s) { return pad + (2 * w + s) * C * LDP; };  // [C][LDP] dS^T: [key][query]
  auto sEs = [&](int w) { return pad + (4 + w) * C * LDP; };             // [C][LDP] V, then E (chain step)
  float* fl = reinterpret_cast<float*>(pad + S::kPadHalves);
  auto sLse2 = [&](int s) { return fl + s * 5 * C; };
  auto sDelta = [&](int s) { return fl + s * 5 * C + C; };
  auto sGq = [&](int s) { return fl + s * 5 * C + 2 * C; };
  auto sGk = [&](int s, int w) { return fl + s * 5 * C + (3 + w) * C; };
  auto sRow = [&](int s) { return fl + 10 * C + s * 8 * C; };  // [8 warps][C] row sums of dl (kGate)
  float* sDG0 = fl + 26 * C;                                    // [2][group][C] gate column sums (kGate)
  auto sDG = [&](int w) { return sDG0 + w * p.group * C; };
  MbarSet bar(smem_addr(sDG0 + (kGate ? 2 * p.group * C : 0)));
  // mbarriers: 0, 1 query stages; 2 chain (both K~_{.,m-1} and E_{m-1}; the K~_{.,last} at phase 2's start);
  // 3, 4 phase 1 steps
  __shared__ int s_task;
  // (kDet) Per warp: the counters whose turns the warp has taken and added in, and not yet passed (HeldPasses).
  __shared__ int* s_pending[8][kMaxHeld];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // this warpgroup: key chunk c0 + wg
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int row0 = (warp % 4) * 16, r0 = row0 + lane / 4;  // this warp's 16 key rows; this thread's r0, r0 + 8
  const int my_slot = blockIdx.x * 2 + wg;
  T* slot = static_cast<T*>(p.slots) + (int64_t)my_slot * p.slot_chunks * C * D;
  const int slot_row0_of0 = blockIdx.x * 2 * p.slot_chunks * C;  // warpgroup w's slot starts w * slot_chunks * C after
  const T* khat = static_cast<const T*>(p.ws.khat);
  const T* vin = static_cast<const T*>(p.v);

  bar.init(5);
  // Issued by thread 0 only.
  // A level's step (E_unit of a near level, F of the far level whose block starts at unit; D x D) into a tile, on
  // barrier b.
  auto load_level_step = [&](bool far, int unit, int dst_tile, int h, uint32_t b) {
    if (far)
      tma_load_2d(smem_addr(tile(dst_tile)), &tm_bstep, 0, (p.blk_of[unit] * p.H + h) * D, b);
    else
      tma_load_2d(smem_addr(tile(dst_tile)), &tm_step, 0, (unit * p.H + h) * D, b);
  };
  auto issue_step = [&](int i, int dst_tile, bool far, int unit, int h) {
    mbar_arrive_expect_tx(bar(i), S::kTile * 2);
    load_level_step(far, unit, dst_tile, h, bar(i));
  };
  // stage s <- step (query chunk m, head hq): Q^_m (near) or Q'_m (far), dO^_m
  auto issue_query = [&](int s, int m, int hq, int gc, bool two, bool far) {
    const int64_t qrow = (int64_t)m * p.HQ + hq;
    mbar_arrive_expect_tx(bar(s), 2 * S::kTile * 2 + 2 * C * 4 + (kGate ? (two ? 3 : 2) * C * 4 : 0));
    tma_load_2d(smem_addr(tile(4 + 2 * s)), far ? &tm_qfar : &tm_q, 0, static_cast<int>(qrow * C), bar(s));
    tma_load_2d(smem_addr(tile(5 + 2 * s)), &tm_do, 0, static_cast<int>(qrow * C), bar(s));
    bulk_load(smem_addr(sLse2(s)), p.lse2 + qrow * C, C * 4, bar(s));
    bulk_load(smem_addr(sDelta(s)), p.delta + qrow * C, C * 4, bar(s));
    if constexpr (kGate) {
      bulk_load(smem_addr(sGq(s)), p.ws.gl + qrow * C, C * 4, bar(s));
      bulk_load(smem_addr(sGk(s, 0)), p.ws.gl + ((int64_t)gc * p.HQ + hq) * C, C * 4, bar(s));
      if (two) bulk_load(smem_addr(sGk(s, 1)), p.ws.gl + ((int64_t)(gc + 1) * p.HQ + hq) * C, C * 4, bar(s));
    }
  };
  // The turns' passes, deferred (bwd_detail::defer_pass): this warp's slots. flush_pass at a step's start (once
  // held_passes - 1 are held), flush_all at the task's end.
  HeldPasses held{s_pending[warp], 0};
  const TurnFence fence = turn_fence_of(p);
  auto flush_pass = [&]() {
    if constexpr (kDet) flush_passes<kBulk>(held, fence, p.held_passes - 1);
  };
  auto flush_all = [&]() {
    if constexpr (kDet) flush_passes<kBulk>(held, fence);
  };
  auto hold_pass = [&](int* c) {
    if constexpr (kDet) defer_pass<kBulk>(held, c, fence, p.held_passes);
  };
  // The turns' bulk form (kBulk; docs/perf/notes.md "The turns' tiles as bulk reductions"): a tile addition in turn
  // stages the tile in shared memory, each warp its own 16 rows, and each warp's lane 0 issues its rows (and, in the
  // warpgroup's first warp, the gate's row sums) as bulk reductions in the warp's turn and holds the pass, which it
  // passes at a later flush point once they are complete (flush_passes<true>). No lane but lane 0 fences, and it
  // waits only for its own reductions, not for 256 float4 atomics; the copy engine does the adds. The warps never
  // wait for each other: no barrier among a warpgroup's warps (compute-sanitizer's racecheck mis-tracks named
  // barriers that one warpgroup takes while the other does not: it then reports hazards even between take_task's
  // two __syncthreads, as it did for the first per-warpgroup turns; docs/perf/notes.md). Each warpgroup has two
  // staging buffers, used in turn: before a warp writes its rows of one again, the reductions that read them two
  // additions ago are done reading (its lane 0's wait_group.read 1).
  float* const stage0 = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(sm) + S::stage_offset(p.group, kGate));
  const bool lead = __shfl_sync(0xffffffffu, (threadIdx.x / 32) % 4, 0) == 0;  // the warpgroup's first warp
  int nbuf = 0;  // this warpgroup's next staging buffer (every thread of the warpgroup keeps it alike)
  // bulk_stage: acc, the warpgroup's C x 64 tile (rows >= rows zero), into its next buffer (this warp's rows); with_rows
  // (the gate): the C row sums of dl beside it, by the first warp, lane l's row_value (rows l and l + 32 in
  // row_values). bulk_issue: in this warp's turn (counter, turn), its rows of the buffer staged last added to map's
  // (x = 0, 32; y + row0) box pair (16 x 32 boxes), the row sums to grow. A tile is staged as soon as its products are
  // done, so that its registers are free, and issued where the additions' order wants it: right after, or in the
  // chain step (dq_add below).
  int staged = 0;  // the buffer bulk_stage filled last
  auto bulk_stage = [&](auto with_rows, const float (&acc)[8][4], int rows, float2 row_values) {
    constexpr bool kRows = decltype(with_rows)::value;
    float* tile = stage0 + (2 * wg + nbuf) * (C * 64);
    if (lane == 0) bulk_wait_group_read<1>();
    __syncwarp();  // this warp's rows of the buffer are read by its last reductions
    stage_acc_swz(acc, tile, C * 32, row0, rows);
    if constexpr (kRows) {
      if (lead) {
        float* rowbuf = stage0 + 4 * C * 64 + (2 * wg + nbuf) * C;
        rowbuf[lane] = lane < rows ? row_values.x : 0.f;
        rowbuf[lane + 32] = lane + 32 < rows ? row_values.y : 0.f;
      }
    }
    fence_proxy_async_smem();  // these stores, before the copy engine reads them
    __syncwarp();
    staged = nbuf;
    nbuf ^= 1;
  };
  auto bulk_issue = [&](auto with_rows, const CUtensorMap* map, int y, float* grow, int* counter, int turn) {
    constexpr bool kRows = decltype(with_rows)::value;
    if (!(p.timing_skip & 1024)) warp_wait_turn(counter, turn, 4);
    if (lane == 0) {
      fence_proxy_async_global();  // the turn's acquire, before the copy engine's adds
      reduce_staged_tile(map, 0, y + row0, stage0 + (2 * wg + staged) * (C * 64) + row0 * 32, C * 32);
      if constexpr (kRows)
        if (lead) bulk_reduce_add_f32(grow, smem_addr(stage0 + 4 * C * 64 + (2 * wg + staged) * C), C * 4);
      bulk_commit_group();
    }
    hold_pass(counter);
  };
  // The atomic form's stash (kDet without kBulk): a dQ^ tile whose addition waits for the chain step (dq_add), in
  // shared memory meanwhile, each thread's 32 values as 8 float4 at (k, thread) (a warp's float4 stores and loads
  // contiguous). Only the tail warpgroup of a level's last step stashes, and reads back before the next step's
  // barrier; the next stash comes after that barrier. Held in registers instead (v19 as first built), the tile
  // was live across the chain step's products, and ptxas serialised every wgmma of the deterministic instances
  // (C7512: "insufficient register resources").
  float4* const stash = reinterpret_cast<float4*>(stage0);
  auto stash_acc = [&](const float (&acc)[8][4]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) stash[k * 128 + threadIdx.x % 128] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
  };
  auto unstash_acc = [&](float (&acc)[8][4]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 v = stash[k * 128 + threadIdx.x % 128];
      acc[k][0] = v.x, acc[k][1] = v.y, acc[k][2] = v.z, acc[k][3] = v.w;
    }
  };
  __syncthreads();

  for (;;) {
    const int task = take_task(p, s_task);
    if (task < 0) break;
    const int gc = task / p.H, h = task % p.H;  // the block's first chunk c0
    const ChunkInfo ci = p.chunks[gc];
    const int last = ci.last;
    const bool has1 = gc + 1 <= last;       // the block has a second chunk
    const int myc = gc + wg;                // this warpgroup's key chunk
    const bool mine = wg == 0 || has1;      // ... which exists
    const int64_t fac = (int64_t)myc * p.H + h;
    // The levels of chunk c0 (cuda/bwd_blocks.h; with blocks off one per later chunk). Blocks have an even size
    // here (plan.h bwd_block_for), so c0 and c0 + 1 share a block: warpgroup 1's levels are warpgroup 0's from level
    // 1 on (its level i is warpgroup 0's i + 1: the same step, the same query chunks), and at level 0 (chunk c0 + 1,
    // its own) it is idle.
    const BwdLevelsOf<kBlocks> lv(BwdLevels::of(gc, ci.first, last, kBlocks ? p.carry_block : 0));
    const int levels = lv.count();

    // V of both chunks (A fragments for the whole task) through the padded tiles; K^ into f32 registers.
    load_tile<T, D, false>(sEs(0), LDP, vin + ci.b * p.sv.b + (int64_t)ci.t0 * p.sv.t + h * p.sv.h, p.sv.t, ci.len);
    if (has1) {
      const ChunkInfo c1 = p.chunks[gc + 1];
      load_tile<T, D, false>(sEs(1), LDP, vin + c1.b * p.sv.b + (int64_t)c1.t0 * p.sv.t + h * p.sv.h, p.sv.t, c1.len);
    }
    cp_async_commit();
    if (threadIdx.x == 0 && levels > 1) {
      fence_proxy_async_smem();
      issue_step(3, 8, lv.is_far(0), lv.unit(0), h);
    }
    if constexpr (kGate)
      for (int i = threadIdx.x; i < 2 * p.group * C; i += blockDim.x) sDG0[i] = 0.f;
    float kc[NT][4];
    if (mine)
      load_acc<T, NT>(kc, khat + fac * C * D, D, row0);
    else
      zero(kc);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t va[KD][4];
    load_a<KD>(va, sEs(wg), LDP, row0);

    // ---- Phase 1: each warpgroup carries its K^ to every level's start, keeping each copy in its slot
    // (Eq. 18, 32, 49); warpgroup 1's levels start one later, so both apply the same step at level i.
    for (int i = 0; i < levels; ++i) {
      const int my_level = i - wg;  // this warpgroup's level (warpgroup 1: none at i = 0)
      if (mine && my_level >= 0) store_acc<T, NT>(kc, slot + (int64_t)my_level * C * D, D, row0);
      if (i + 1 == levels) break;
      const int b = i & 1;
      __syncthreads();  // both warpgroups are done with tile 8 + (b ^ 1)
      if (threadIdx.x == 0 && i + 2 < levels) {
        fence_proxy_async_smem();
        issue_step(3 + (b ^ 1), 8 + (b ^ 1), lv.is_far(i + 1), lv.unit(i + 1), h);
      }
      bar.wait(3 + b);
      if (mine && my_level >= 0) {
        uint32_t ka[KD][4];
        to_a_frags<T, NT>(kc, ka, 1.f);
        wgmma_fence_operand(kc);
        wgmma_fence();
        wgmma_k64<1>(kc, ka, tile(8 + b), true);  // K~ <- K~ + K~ step_i  (K~ P_m^T, K~ Pi_mu^T)
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(kc);
      }
    }
    // The slots' rows were written by ordinary stores; the copy engine reads them next (phase 2).
    fence_proxy_async_global();
    __syncthreads();

    // ---- Phase 2: levels from the farthest back to the nearest, each level's query chunks from its last, every
    // query head of the group in turn (with blocks off: query chunks from the last back to c0 + 1).
    float e_acc[NT][4], dv_acc[NT][4];
    zero(e_acc);
    zero(dv_acc);
    int kt = 0;  // warpgroup w's tile 2 w + kt holds its K~ of the current level
    const int slot_chunk_rows = p.slot_chunks * C;
    // Phase 2's copies of step it are issued by the first thread of the warpgroup that reaches step it's start first:
    // after a plain step (GQA's heads but the last, a far level's query chunks but the last) warpgroup it % 2, which
    // did not run step it - 1's tail; after a chain step, in det mode, warpgroup (it - 1) % 2, whose dQ^ tail ran
    // beside the other's dP_j products and tail (v19, below; in the fast mode it % 2, as after a plain step). The
    // first step: warpgroup 0.
    constexpr bool kAddBeside = kDet;  // v19's placement of a chain step's dQ^ addition (below, at dq_add)
    auto producer = [&](int step, bool after_chain) {
      return threadIdx.x == 128 * ((after_chain ? step - 1 : step) & 1);
    };
    // Level i's K~ (both warpgroups' that exist at i) into tile set x, and with ebuf >= 0 level i's step into tile
    // 8 + ebuf, on barrier 2.
    auto issue_ktiles = [&](int x, int i, int ebuf) {
      const bool two = has1 && i > 0;
      mbar_arrive_expect_tx(bar(2), ((two ? 2 : 1) + (ebuf >= 0 ? 1 : 0)) * S::kTile * 2);
      tma_load_2d(smem_addr(tile(x)), &tm_slot, 0, slot_row0_of0 + i * C, bar(2));
      if (two) tma_load_2d(smem_addr(tile(2 + x)), &tm_slot, 0, slot_row0_of0 + slot_chunk_rows + (i - 1) * C, bar(2));
      if (ebuf >= 0) load_level_step(lv.is_far(i), lv.unit(i), 8 + ebuf, h, bar(2));
    };
    if (producer(0, false) && levels > 0) {  // (a sequence's last chunk has no later query chunk: no phase 2)
      fence_proxy_async_smem();  // the previous task's ldmatrix reads of the K~ tiles, before the copy engine's writes
      issue_ktiles(0, levels - 1, -1);
      issue_query(0, lv.query_hi(levels - 1), h * p.group, gc, has1 && levels > 1, lv.is_far(levels - 1));
    }
    int it = 0;  // (query chunk, head) steps so far: the stage is it & 1
    // One iteration per query chunk m of level i (levels from the farthest, each level's chunks from its last), the
    // chain step after a level's last: one loop, as the per-chunk form's over m was (its registers: 253-255).
    for (int i = levels - 1, m = levels > 0 ? lv.query_hi(levels - 1) : 0; i >= 0;) {
      const bool far = lv.is_far(i);
      const int m_lo = lv.query_lo(i);
      const bool level_start = !kBlocks || m == lv.query_hi(i);  // the level's first query chunk
      const ChunkInfo cm = p.chunks[m];
      const bool act1 = has1 && i > 0;      // warpgroup 1 has logits at level i (level 0 is its own chunk)
      const bool active = wg == 0 || act1;  // this warpgroup
      const bool chain = i > 0;             // a chain step follows the level
      const int ebuf = (levels - 1 - i) & 1;  // the chain's step tile (level i - 1's): 8 + ebuf
      if (i == levels - 1 && level_start) {
        bar.wait(2);
        // Every thread has seen this completion before the producer arms barrier 2 again (below, at j = 0): a
        // thread that looked only after the next completion would find the parity it waits for gone.
        __syncthreads();
      }
      // A step's dQ^ (near) or dQ' (far) addition (its turn in det mode, the gate's row sums, the atomic tile, the
      // pass), by the warpgroup that ran its products. Of the level's last step with a chain step after it, it runs
      // in the chain step, beside the other warpgroup's dP_j products and addition (v19): before, one warpgroup ran
      // both additions one after the other while the other waited at the chain's barrier. In the deterministic
      // mode only (kAddBeside): measured on an H100 (twenty-ninth session, two A/B rounds against the addition in
      // the loop), bwd_main 1.3-2.2% faster in det mode at T 4096 / 16384 (3.5% slower at T 1024), but 3.6-5.6%
      // slower in the fast mode at every T, where no turn is waited for and the loop's addition already overlapped.
      // dQ^_m and dQ'_m of one query row share a counter (cuda/bwd_blocks.h): task c0 adds after the
      // (m - 1 - c0) / 2 tasks that start above it, near or far (half the one-chunk kernel's turn).
      // dq_add: the addition from registers, now; dq_hold at the tail and dq_add_held in the chain step: deferred, the
      // tile staged (kBulk) or stashed (atomic form) in between, out of the registers.
      auto dq_bulk_stage = [&](const float (&dq)[8][4], int st, int len) {
        float2 gsum = make_float2(0.f, 0.f);  // rows lane, lane + 32 of the 8 warps' row sums of dl, in the atomic
                                              // form's order (the first warp stages them)
        if constexpr (kGate) {
          if (lead) {
            const float* rs = sRow(st);
            auto sum8 = [&](int t) {
              return ((rs[t] + rs[C + t]) + (rs[2 * C + t] + rs[3 * C + t])) +
                     ((rs[4 * C + t] + rs[5 * C + t]) + (rs[6 * C + t] + rs[7 * C + t]));
            };
            gsum = make_float2(sum8(lane), sum8(lane + 32));
          }
        }
        bulk_stage(std::bool_constant<kGate>{}, dq, len, gsum);
      };
      auto dq_bulk_issue = [&](int m, int64_t qrow) {
        bulk_issue(std::bool_constant<kGate>{}, far ? &tmaps.dqfar : &tmaps.dq, static_cast<int>(qrow * C),
                   kGate ? p.dgrow + qrow * C : nullptr, p.count_q + qrow, lv.query_turn(m) / 2);
      };
      auto dq_add = [&](const float (&dq)[8][4], int m, int64_t qrow, int st, int len) {
        if constexpr (kBulk) {
          dq_bulk_stage(dq, st, len);
          dq_bulk_issue(m, qrow);
          return;
        }
        if constexpr (kDet) if (!(p.timing_skip & 1024)) warp_wait_turn(p.count_q + qrow, lv.query_turn(m) / 2, 4);
        if constexpr (kGate) {  // dgrow[t] += the 8 warps' row sums, in a fixed order
          const float* rs = sRow(st);
          const int t = threadIdx.x % 128;
          if (t < len)
            atomicAdd(p.dgrow + qrow * C + t, ((rs[t] + rs[C + t]) + (rs[2 * C + t] + rs[3 * C + t])) +
                                                  ((rs[4 * C + t] + rs[5 * C + t]) + (rs[6 * C + t] + rs[7 * C + t])));
        }
        atomic_add_acc<8>(dq, (far ? p.dqfar : p.dqacc) + qrow * C * D, D, row0, len);
        hold_pass(p.count_q + qrow);
      };
      auto dq_hold = [&](const float (&dq)[8][4], int st, int len) {
        if constexpr (kBulk)
          dq_bulk_stage(dq, st, len);
        else
          stash_acc(dq);
      };
      auto dq_add_held = [&](int m, int64_t qrow, int st, int len) {
        if constexpr (kBulk) {
          dq_bulk_issue(m, qrow);
        } else {
          float dq[8][4];
          unstash_acc(dq);
          dq_add(dq, m, qrow, st, len);
        }
      };
      {
        uint32_t ka[KD][4];  // this warpgroup's K~ of level i as A fragments, for every head of the group
        for (int j = 0; j < p.group; ++j, ++it) {
          const int st = it & 1;
          const int hq = h * p.group + j;
          const int64_t qrow = (int64_t)m * p.HQ + hq;
          const bool level_end = m == m_lo && j + 1 == p.group;  // the level's last step
          // Stage st ^ 1 (the previous step's) was released by that step's barrier, which the producer has passed;
          // the K~ tiles it overwrites held the previous level's, last read by the dQ^ products of that level's
          // last step, which the chain step's barrier waited for; the step tile it overwrites was last read two
          // chain steps ago.
          if (producer(it, kAddBeside && j == 0 && level_start && i < levels - 1)) {
            fence_proxy_async_smem();
            if (j + 1 < p.group)
              issue_query(st ^ 1, m, hq + 1, gc, act1, far);
            else if (m > m_lo)
              issue_query(st ^ 1, m - 1, h * p.group, gc, act1, far);
            else if (i > 0)
              issue_query(st ^ 1, lv.query_hi(i - 1), h * p.group, gc, has1 && i - 1 > 0, lv.is_far(i - 1));
            if (j == 0 && level_start && i > 0) issue_ktiles(kt ^ 1, i - 1, ebuf);  // the chain step's K~, step
          }
          if (j == 0 && active) load_a_swz(ka, tile(2 * wg + kt), row0);
          float gdelta = 0.f;  // G_i - G_j = (goff_m - goff_c) + gl_i - gl_j, the large offsets subtracted in f64
          if constexpr (kGate)
            if (active) gdelta = static_cast<float>(p.ws.goff[qrow] - p.ws.goff[(int64_t)myc * p.HQ + hq]);
          bar.wait(st);
          const T* sQ = tile(4 + 2 * st);
          const T* sdO = tile(5 + 2 * st);
          if (active) {
            float s[NC8][4], dp[NC8][4];
            wgmma_fence_operand(s);
            wgmma_fence_operand(dp);
            wgmma_fence();
            wgmma_k64<0>(s, ka, sQ, false);    // S^T = K~ Q^T: [key][query] (Q^_m, or Q'_m at a far level)
            wgmma_k64<0>(dp, va, sdO, false);  // (dO V^T)^T = V dO^T
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operand(s);
            wgmma_fence_operand(dp);
            float colsum[2];  // this thread's key rows: sum over queries of dl
            softmax_backward<kGate>(s, dp, p.scale_log2, sLse2(st), sDelta(st), sGq(st), sGk(st, wg), gdelta, r0, colsum);
            // dV += P^T dO_m (Eq. 5), E += ds^T Q (Eq. 21): asynchronous while ds^T goes to shared memory.
            uint32_t pa[KC][4], da[KC][4];
            to_a_frags<T, NC8>(s, pa, 1.f);
            to_a_frags<T, NC8>(dp, da, p.scale);
            wgmma_fence_operand(dv_acc);
            wgmma_fence_operand(e_acc);
            wgmma_fence();
            wgmma_k64<1>(dv_acc, pa, sdO, true);
            wgmma_k64<1>(e_acc, da, sQ, true);
            wgmma_commit();
            store_acc<T, NC8>(dp, sDS(wg, st), LDP, row0, p.scale);
            if constexpr (kGate) gate_tile_sums(colsum, dp, sDG(wg) + j * C, sRow(st), r0);
            flush_pass();     // (the last tail's and chain step's passes, while dV and E's products run)
            wgmma_wait<0>();  // the stage's Q and dO^ are read: the barrier below releases them
            wgmma_fence_operand(dv_acc);
            wgmma_fence_operand(e_acc);
            wgmma_fence_frags(pa);
            wgmma_fence_frags(da);
          } else {
            if constexpr (kGate)
              for (int x = threadIdx.x % 128; x < 4 * C; x += 128) sRow(st)[4 * C + x] = 0.f;  // warpgroup 1's rows
            flush_pass();
          }
          __syncthreads();  // both dS^T (and row sums) complete; stage st consumed
          if (wg == (it & 1)) {  // this step's tail
            // dQ_m += dS_0 K~_0 + dS_1 K~_1 (Eq. 21): query rows now, A = dS = (dS^T)^T via ldmatrix.trans.
            float dq[8][4];
            uint32_t qa[KC][4];
            load_a_t<KC>(qa, sDS(0, st), LDP, row0);
            wgmma_fence_operand(dq);
            wgmma_fence();
            wgmma_k64<1>(dq, qa, tile(kt), false);
            wgmma_commit();
            uint32_t qb[KC][4];
            if (act1) {
              load_a_t<KC>(qb, sDS(1, st), LDP, row0);
              wgmma_fence();
              wgmma_k64<1>(dq, qb, tile(2 + kt), true);
              wgmma_commit();
            }
            wgmma_wait<0>();
            wgmma_fence_operand(dq);
            wgmma_fence_frags(qa);
            if (act1) wgmma_fence_frags(qb);
            // (Its products are done here in both cases: the K~ tiles they read are reloaded after the chain step.)
            if (!kAddBeside || !chain || !level_end)
              dq_add(dq, m, qrow, st, cm.len);
            else
              dq_hold(dq, st, cm.len);
          }
        }
      }

      if (m > m_lo) {  // the level's next query chunk
        --m;
        continue;
      }
      if (chain) {
        // Back through level i's start = level i - 1's K~ carried by its step (Eq. 33, 50): dstep_{i-1} += E_0^T
        // K~_0 + E_1^T K~_1, E <- E + E step_{i-1}^T (E_m's gradient dP_m at a near level, F_mu's dPi_mu at a far one).
        const bool far_prev = lv.is_far(i - 1);
        const int u = lv.unit(i - 1);
        const bool chain1 = has1 && i - 1 > 0;  // warpgroup 1 has a level i - 1 (else its E is final)
        store_acc<T, NT>(e_acc, sEs(wg), LDP, row0);
        bar.wait(2);
        __syncthreads();  // both E complete in shared memory
        const bool update = wg == 0 || chain1;
        const int tail = (it - 1) & 1;  // ran the last step's dQ^ products; adds them now (dq_add)
        const int owner = kAddBeside ? tail ^ 1 : tail;  // dP_j's products and addition (beside dq_add: the other)
        uint32_t eb[KD][4];
        if (update) to_a_frags<T, NT>(e_acc, eb, 1.f);
        if (wg == owner) {
          uint32_t ea[KC][4], ea1[KC][4];
          load_a_t<KC>(ea, sEs(0), LDP, row0);  // A(d, key) = E[key][d]: rows d = 16 (warp % 4)..
          float dpj[8][4];
          wgmma_fence_operand(dpj);
          wgmma_fence();
          wgmma_k64<1>(dpj, ea, tile(kt ^ 1), false);
          if (chain1) {
            load_a_t<KC>(ea1, sEs(1), LDP, row0);
            wgmma_fence();
            wgmma_k64<1>(dpj, ea1, tile(2 + (kt ^ 1)), true);
          }
          wgmma_commit();
          if (update) {
            wgmma_fence_operand(e_acc);
            wgmma_fence();
            wgmma_k64<0>(e_acc, eb, tile(8 + ebuf), true);  // E <- E + E step^T
            wgmma_commit();
            wgmma_wait<1>();  // dP_j's products are done; E's may still run
          } else {
            wgmma_wait<0>();
          }
          wgmma_fence_operand(dpj);
          wgmma_fence_frags(ea);
          if (chain1) wgmma_fence_frags(ea1);
          const int64_t unit_h = (int64_t)(far_prev ? p.blk_of[u] : u) * p.H + h;
          int* count = (far_prev ? p.count_pi : p.count_p) + unit_h;
          if constexpr (kBulk) {
            bulk_stage(std::false_type{}, dpj, D, make_float2(0.f, 0.f));
            bulk_issue(std::false_type{}, far_prev ? &tmaps.dpi : &tmaps.dp, static_cast<int>(unit_h * D), nullptr, count,
                       lv.step_turn(i - 1) / 2);
          } else {
            if constexpr (kDet) if (!(p.timing_skip & 1024)) warp_wait_turn(count, lv.step_turn(i - 1) / 2, 4);
            atomic_add_acc<8>(dpj, (far_prev ? p.dpiacc : p.dpacc) + unit_h * D * D, D, row0, D);
            hold_pass(count);
          }
        } else {
          if (update) {
            wgmma_fence_operand(e_acc);
            wgmma_fence();
            wgmma_k64<0>(e_acc, eb, tile(8 + ebuf), true);  // E <- E + E step^T
            wgmma_commit();
          }
          // The level's last step's dQ addition (its turn before this warp's next one, as before the move).
          if constexpr (kAddBeside) dq_add_held(m, (int64_t)m * p.HQ + h * p.group + p.group - 1, tail, cm.len);  // (m = m_lo)
        }
        wgmma_wait<0>();
        wgmma_fence_operand(e_acc);
        if (update) wgmma_fence_frags(eb);
        kt ^= 1;  // level i - 1's K~ is the next level's
      }
      if (--i >= 0) m = lv.query_hi(i);
    }

    flush_all();
    // ---- The task's own gradients: each warpgroup its chunk's dK^ = E and dV (zero when no query chunk follows it).
    if constexpr (kGate) __syncthreads();  // the column sums were written by other threads of the warpgroup
    if (mine) {
      constexpr int kC = C;
      store_acc_f32<NT>(e_acc, p.dkacc + fac * kC * D, D, row0);
      store_acc_f32<NT>(dv_acc, p.dvacc + fac * kC * D, D, row0);
      if constexpr (kGate) {
        const float* dg = sDG(wg);
        for (int i = threadIdx.x % 128; i < p.group * kC; i += 128)
          p.dgacc[((int64_t)myc * p.HQ + h * p.group + i / kC) * kC + i % kC] = dg[i];
      }
    }
  }
  // (kBulk) A flush without the fence (timing only) left reductions pending: they read shared memory until done.
  if constexpr (kBulk)
    if (lane == 0) bulk_wait_group<0>();
}

}  // namespace pathattn::cuda
