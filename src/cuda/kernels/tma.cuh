// Hopper's bulk copy engine (TMA) and the shared-memory barriers it completes on, through inline PTX (sm_90).
//
// One thread arms a barrier with the bytes it expects (arrive.expect_tx) and issues the copies; each copy
// counts its bytes down on the barrier (complete_tx); every consumer thread waits on the barrier's phase parity.
// A tensor-map copy writes shared memory in the map's swizzle (128-byte here: the layout wgmma.cuh reads).
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "cuda/kernels/common.cuh"

namespace pathattn::cuda {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes barrier initialisation visible to the copy engine (the async proxy); a __syncthreads must follow.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// A kernel's mbarriers at consecutive 8-byte slots from `base` (a shared-window address), each completed by one
// arrival (the issuing thread's expect_tx) and its copies' bytes, and the parity this thread waits for next at each
// (bit i: barrier i; every thread waits for every completion, so the bits stay in step).
struct MbarSet {
  uint32_t base;
  uint32_t phase = 0;
  __device__ __forceinline__ explicit MbarSet(uint32_t b) : base(b) {}
  __device__ __forceinline__ uint32_t operator()(int i) const { return base + 8 * i; }
  // By thread 0; a __syncthreads must follow before any use.
  __device__ __forceinline__ void init(int n) const {
    if (threadIdx.x == 0) {
      for (int i = 0; i < n; ++i) mbar_init(base + 8 * i, 1);
      mbar_fence_init();
    }
  }
  __device__ __forceinline__ void wait(int i) {
    mbar_wait(base + 8 * i, (phase >> i) & 1);
    phase ^= 1u << i;
  }
};

// Tile at coordinates (x innermost, then y) of a 2-D tensor map into shared memory at dst.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int x, int y, int z, int w, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(w), "r"(bar)
      : "memory");
}
// Plain contiguous copy (bytes a multiple of 16, both addresses 16-byte aligned).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Orders this thread's generic-proxy accesses to global memory with its async-proxy (bulk copy) ones.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Bulk reductions from shared memory into global memory (f32 adds at L2, by the copy engine), tracked per issuing
// thread in bulk async-groups: the deterministic turns' tiles in their bulk form (bwd_main_pair.cuh, kBulk).
// The box at (x, y) of a 2-D f32 tensor map (its 128-byte swizzle: tensor_map_2d_f32) += the tile at src.
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, int x, int y, uint32_t src) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(x), "r"(y), "r"(src)
               : "memory");
}
// dst[0 .. bytes / 4) += the floats at src (bytes a multiple of 16, both addresses 16-byte aligned).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
// Closes this thread's bulk operations issued since the last commit into one bulk async-group.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk async-groups are pending: complete (their writes performed), or with
// the _read form only done reading their shared-memory sources (which may then be overwritten).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Barrier `id` (1..15; 0 is __syncthreads') among `threads` threads (whole warps) of the CTA.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace pathattn::cuda
