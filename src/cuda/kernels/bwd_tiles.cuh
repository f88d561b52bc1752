// Warp-level tile helpers of the backward kernels, beside fwd_tiles.cuh's products (gemm_nt, gemm_nn, to_a_frags):
// A operands loaded straight from shared memory (row-major, or transposed through ldmatrix.trans), accumulator
// tiles moved to and from shared and global memory, and the ordered turns that make cross-block sums
// deterministic. Layouts as common.cuh: a warp owns 16 rows; a thread holds rows g and g + 8 (g = lane / 4),
// columns 8 nt + 2 t4 + {0, 1}. Tiles are row-major with a padded row length `ld` (no swizzle).
#pragma once

#include "cuda/kernels/fwd_tiles.cuh"

namespace pathattn::cuda::bwd_detail {

// A fragments of rows row0..row0+15 of a [rows][k] tile: A(i, k) = s[i][k], k blocks of 16.
template <int KB, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[KB][4], const T* s, int ld, int row0) {
  const int lane = threadIdx.x % 32;
  const int r = row0 + lane % 8 + 8 * ((lane / 8) % 2), c = 8 * (lane / 16);
#pragma unroll
  for (int kk = 0; kk < KB; ++kk) ldsm_x4(a[kk], smem_addr(s + r * ld + kk * 16 + c));
}

// The same from a 128-byte-swizzled tile of 64-element rows (fwd_tiles.cuh swz at ld 64: what TMA writes).
template <int KB, typename T>
__device__ __forceinline__ void load_a_swz(uint32_t (&a)[KB][4], const T* s, int row0) {
  const int lane = threadIdx.x % 32;
  const int r = row0 + lane % 8 + 8 * ((lane / 8) % 2), c = 8 * (lane / 16);
#pragma unroll
  for (int kk = 0; kk < KB; ++kk) ldsm_x4(a[kk], smem_addr(s + fwd_detail::swz<true>(r, kk * 16 + c, 64)));
}

// A fragments of A(i, k) = s[k][i] (A stored transposed, [k][rows]), rows row0..row0+15: ldmatrix.trans.
template <int KB, typename T>
__device__ __forceinline__ void load_a_t(uint32_t (&a)[KB][4], const T* s, int ld, int row0) {
  const int lane = threadIdx.x % 32, q = lane / 8;
  const int k = lane % 8 + 8 * (q / 2), i = row0 + 8 * (q % 2);
#pragma unroll
  for (int kk = 0; kk < KB; ++kk) ldsm_x4_t(a[kk], smem_addr(s + (kk * 16 + k) * ld + i));
}

// acc (rows row0 + g, + 8; NT column tiles of 8) times `scale`, rounded to T, each pair of columns (col, col + 1) at
// at(row, col): the layouts below.
template <typename T, int NT, typename At>
__device__ __forceinline__ void store_acc_at(const float (&acc)[NT][4], At at, int row0, float scale) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      *reinterpret_cast<uint32_t*>(at(row0 + g + 8 * half, nt * 8 + 2 * t4)) =
          TypeTraits<T>::pack(scale * acc[nt][2 * half], scale * acc[nt][2 * half + 1]);
}
// ... into a row-major tile of row length ld.
template <typename T, int NT>
__device__ __forceinline__ void store_acc(const float (&acc)[NT][4], T* s, int64_t ld, int row0, float scale = 1.f) {
  store_acc_at<T>(acc, [&](int r, int c) { return s + r * ld + c; }, row0, scale);
}
// ... into one 128-byte-swizzled 64 x 64 tile (what TMA writes and wgmma reads: fwd_tiles.cuh swz at ld 64), the
// accumulator's columns landing at col0 + ...; a wgmma reads the tile next only after the writers'
// fence.proxy.async and a barrier.
template <typename T, int NT>
__device__ __forceinline__ void store_acc_swz(const float (&acc)[NT][4], T* tile, int row0, int col0, float scale = 1.f) {
  static_assert(NT <= 8, "one 64-column tile");
  store_acc_at<T>(acc, [&](int r, int c) { return tile + fwd_detail::swz<true>(r, col0 + c, 64); }, row0, scale);
}

// The same in f32, through f(at, v) for each pair of columns: v = the accumulator's (col, col + 1), at = their place
// in the row-major f32 tile (plain loads and stores: the caller owns the rows).
template <int NT, typename F>
__device__ __forceinline__ void for_acc_f32(const float (&acc)[NT][4], float* g0, int64_t ld, int row0, F f) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      f(reinterpret_cast<float2*>(g0 + (row0 + g + 8 * half) * ld + nt * 8 + 2 * t4),
        make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]));
}
// ... stored,
template <int NT>
__device__ __forceinline__ void store_acc_f32(const float (&acc)[NT][4], float* g0, int64_t ld, int row0) {
  for_acc_f32(acc, g0, ld, row0, [](float2* at, float2 v) { *at = v; });
}
// ... or added to what is there (kernels/bwd_block_sweep.cuh).
template <int NT>
__device__ __forceinline__ void add_acc_f32(const float (&acc)[NT][4], float* g0, int64_t ld, int row0) {
  for_acc_f32(acc, g0, ld, row0, [](float2* at, float2 v) {
    const float2 o = *at;
    *at = make_float2(o.x + v.x, o.y + v.y);
  });
}

// acc = a row-major T tile's rows (accumulator layout, f32).
template <typename T, int NT>
__device__ __forceinline__ void load_acc(float (&acc)[NT][4], const T* s, int ld, int row0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float2 x = TypeTraits<T>::unpack(*reinterpret_cast<const uint32_t*>(s + (row0 + g + 8 * half) * ld + nt * 8 + 2 * t4));
      acc[nt][2 * half] = x.x;
      acc[nt][2 * half + 1] = x.y;
    }
}

// Adds acc into an f32 global tile (rows row0 + g, + 8 of `rows` valid ones) with atomics: the f32 accumulation
// of contributions from several CTAs (FlashAttention's dQ accumulation). In deterministic mode the caller holds the
// tile's turn (below), so the adds happen in a fixed order and round identically on every run. Lanes t4 and t4 ^ 1
// swap half their values so that each adds four consecutive columns of one row with one float4 atomic (sm_90;
// each element atomic on its own): half the atomic instructions of float2 adds (v3 measured ~8 G float2 atomics
// per 32 x 4096 backward, docs/perf/notes.md).
template <int NT>
__device__ __forceinline__ void atomic_add_acc(const float (&acc)[NT][4], float* g0, int64_t ld, int row0, int rows) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const bool odd = t4 & 1;
  const int r = row0 + g + (odd ? 8 : 0), col = 4 * (t4 / 2);  // even lanes: row g; odd lanes: row g + 8
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    // Even lanes give their row g + 8 pair (columns 4s, 4s + 1) to the odd neighbour, odd lanes their row g pair
    // (columns 4s + 2, 4s + 3) to the even one.
    const float x0 = __shfl_xor_sync(0xffffffffu, odd ? acc[nt][0] : acc[nt][2], 1);
    const float x1 = __shfl_xor_sync(0xffffffffu, odd ? acc[nt][1] : acc[nt][3], 1);
    const float4 v = odd ? make_float4(x0, x1, acc[nt][2], acc[nt][3]) : make_float4(acc[nt][0], acc[nt][1], x0, x1);
    if (r < rows) atomicAdd(reinterpret_cast<float4*>(g0 + r * ld + nt * 8 + col), v);
  }
}

// A persistent main-kernel CTA's next task (chunk * H + h) in list order (plan.cu), or -1 when the list is done.
// Starts with a barrier: the CTA's previous task is done with shared memory and s_task (a __shared__ int).
__device__ __forceinline__ int take_task(const BwdParams& p, int& s_task) {
  __syncthreads();
  if (threadIdx.x == 0) s_task = atomicAdd(p.next_task, 1);
  __syncthreads();
  const int i = s_task;
  return i < p.num_tasks ? p.tasks[i] : -1;
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Ordered turns on a counter in global memory (FlashAttention-3's deterministic backward does the same with its
// semaphores): wait_turn blocks the CTA until `turn` CTAs have passed; pass_turn, after this CTA's adds, lets the
// next one in. Every thread fences its own atomics before the barrier, so the next CTA sees them.
__device__ __forceinline__ void wait_turn(const int* counter, int turn) {
  if (threadIdx.x == 0)
    while (load_acquire(counter) < turn) __nanosleep(64);
  __syncthreads();
}
// The fence with which a warp (or CTA) makes its additions visible before it passes a turn: the release half of the
// turns' ordering, whose acquire half is the waiter's ld.acquire. kSc: __threadfence(), a sequentially consistent
// fence (fence.sc.gpu), what every measurement so far used; kAcqRel: fence.acq_rel.gpu, which is all a release
// needs (CUTLASS's semaphore, under FlashAttention-3's deterministic backward, releases with it) and may cost less
// than SC's fence, which must also order against every other SC fence of the GPU (opt-in, PATHATTN_BWD_FENCE=
// acq_rel, until measured: docs/perf/notes.md); kNone: timing only (PATHATTN_BWD_TIMING_SKIP 512, params.h).
enum class TurnFence : int { kNone = 0, kSc = 1, kAcqRel = 2 };
__device__ __forceinline__ TurnFence turn_fence_of(const BwdParams& p) {
  if (p.timing_skip & 512) return TurnFence::kNone;
  return p.turn_fence_acq_rel ? TurnFence::kAcqRel : TurnFence::kSc;
}
__device__ __forceinline__ void turn_fence(TurnFence f) {
  if (f == TurnFence::kSc)
    __threadfence();
  else if (f == TurnFence::kAcqRel)
    asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}
__device__ __forceinline__ void pass_turn(int* counter) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(counter, 1);
}

}  // namespace pathattn::cuda::bwd_detail
