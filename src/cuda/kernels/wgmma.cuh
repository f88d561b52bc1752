// Hopper warpgroup matrix multiply (wgmma, sm_90a) through inline PTX: shared-memory matrix descriptors, the
// m64n64k16 product with A in registers (RS form), m64n64k16 and m64n32k16 with A in shared memory (SS form), the
// TF32 m64n64k8 in both forms, f32 accumulators, and the fences around them.
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): the 4 warps of a warpgroup own
// rows 16w..16w+15 of the 64-row tile; per warp, the A fragment of one k16 step and the accumulator of each
// 8-column block are exactly mma.sync m16n8k16's A and C fragments (common.cuh), so results of the warp-level
// code (P, the running query) feed wgmma without leaving registers.
//
// B comes from shared memory in the 128-byte swizzle: rows of 64 16-bit elements (128 bytes), the 16-byte chunk
// index XOR (row % 8), tiles aligned to 1024 bytes. This is fwd_tiles.cuh's swz() layout at a row length of 64.
//   K-major B (B(k, n) stored as [n][k]: K^, E):  8-row groups 1024 bytes apart (SBO); a k16 step moves the
//     start address by 32 bytes inside the swizzled row (the hardware applies the XOR to the final address).
//   MN-major B (B(k, n) stored as [k][n]: V, transposed on the fly): the same layout read with trans-b = 1;
//     8-row (k) groups 1024 bytes apart (SBO); N = 64 is one swizzle width, so LBO is unused; a k16 step is
//     two 8-row groups, 2048 bytes.
#pragma once

#include <cstdint>

#include "cuda/kernels/common.cuh"

namespace pathattn::cuda {

// Descriptor of a 128-byte-swizzled shared-memory matrix starting at `addr` (shared-window byte address).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr, uint32_t sbo_bytes = 1024, uint32_t lbo_bytes = 16) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // layout type 1: 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers around asynchronous products, so the compiler neither reads them early nor moves
// them while a wgmma owns them (the role of CUTLASS's warpgroup_fence_operand).
template <int NT>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
// The same for A fragments in registers: a wgmma reads them asynchronously until its wait, but to the compiler they
// die at the instruction, so code between commit and wait could reuse their registers. This keeps them live.
template <int KT>
__device__ __forceinline__ void wgmma_fence_frags(uint32_t (&a)[KT][4]) {
#pragma unroll
  for (int i = 0; i < KT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}
// Shared memory written by ordinary stores or cp.async, read next by wgmma (the async proxy).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

struct bf16_tag {};
struct f16_tag {};
template <typename T>
struct WgmmaTag;
template <>
struct WgmmaTag<__nv_bfloat16> {
  using type = bf16_tag;
};
template <>
struct WgmmaTag<__half> {
  using type = f16_tag;
};

// d[64 x 64] (+)= A[64 x 16] (registers, this warp's 16 rows) * B[16 x 64] (descriptor); accumulate = 0 overwrites.
// One definition per input type (bf16, f16), which the instruction names; the 32 accumulator operands are
// d[kOff .. kOff + 7] (kOff = 8: the second 64 columns of a 128-column accumulator, fwd_wgmma.cuh at D = 128).
#define PATHATTN_WGMMA_D32                                                                                           \
  "+f"(d[kOff + 0][0]), "+f"(d[kOff + 0][1]), "+f"(d[kOff + 0][2]), "+f"(d[kOff + 0][3]),                            \
  "+f"(d[kOff + 1][0]), "+f"(d[kOff + 1][1]), "+f"(d[kOff + 1][2]), "+f"(d[kOff + 1][3]),                            \
  "+f"(d[kOff + 2][0]), "+f"(d[kOff + 2][1]), "+f"(d[kOff + 2][2]), "+f"(d[kOff + 2][3]),                            \
  "+f"(d[kOff + 3][0]), "+f"(d[kOff + 3][1]), "+f"(d[kOff + 3][2]), "+f"(d[kOff + 3][3]),                            \
  "+f"(d[kOff + 4][0]), "+f"(d[kOff + 4][1]), "+f"(d[kOff + 4][2]), "+f"(d[kOff + 4][3]),                            \
  "+f"(d[kOff + 5][0]), "+f"(d[kOff + 5][1]), "+f"(d[kOff + 5][2]), "+f"(d[kOff + 5][3]),                            \
  "+f"(d[kOff + 6][0]), "+f"(d[kOff + 6][1]), "+f"(d[kOff + 6][2]), "+f"(d[kOff + 6][3]),                            \
  "+f"(d[kOff + 7][0]), "+f"(d[kOff + 7][1]), "+f"(d[kOff + 7][2]), "+f"(d[kOff + 7][3])
#define PATHATTN_WGMMA_M64N64K16_RS(TY)                                                                              \
  template <int kTransB, int kOff = 0, int NT>                                                                       \
  __device__ __forceinline__ void wgmma_m64n64k16_rs(float(&d)[NT][4], const uint32_t(&a)[4], uint64_t desc_b,       \
                                                     int accumulate, TY##_tag) {                                     \
    static_assert(kOff + 8 <= NT, "the accumulator holds 8 column blocks from kOff");                               \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " "                                                \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                    \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "                                         \
        "{%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"                                                                 \
        : PATHATTN_WGMMA_D32                                                                                         \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kTransB), "r"(accumulate));                   \
  }
PATHATTN_WGMMA_M64N64K16_RS(bf16)
PATHATTN_WGMMA_M64N64K16_RS(f16)
#undef PATHATTN_WGMMA_M64N64K16_RS

// The SS form: A from shared memory too (a descriptor, as B's), for operands that a warpgroup did not compute
// itself or shares with the other warpgroup (bwd_main_wide.cuh). kTransA = 0: A(m, k) stored [m][k] (K-major,
// as kTransB = 0); kTransA = 1: stored [k][m] (MN-major), which the instruction transposes (16-bit types only).
// m64n64k16 (32 accumulator registers from kOff) and m64n32k16 (16).
#define PATHATTN_WGMMA_D16                                                                                           \
  "+f"(d[kOff + 0][0]), "+f"(d[kOff + 0][1]), "+f"(d[kOff + 0][2]), "+f"(d[kOff + 0][3]),                            \
  "+f"(d[kOff + 1][0]), "+f"(d[kOff + 1][1]), "+f"(d[kOff + 1][2]), "+f"(d[kOff + 1][3]),                            \
  "+f"(d[kOff + 2][0]), "+f"(d[kOff + 2][1]), "+f"(d[kOff + 2][2]), "+f"(d[kOff + 2][3]),                            \
  "+f"(d[kOff + 3][0]), "+f"(d[kOff + 3][1]), "+f"(d[kOff + 3][2]), "+f"(d[kOff + 3][3])
#define PATHATTN_WGMMA_SS(TY)                                                                                        \
  template <int kTransA, int kTransB, int kOff = 0, int NT>                                                          \
  __device__ __forceinline__ void wgmma_m64n64k16_ss(float(&d)[NT][4], uint64_t desc_a, uint64_t desc_b,             \
                                                     int accumulate, TY##_tag) {                                     \
    static_assert(kOff + 8 <= NT, "the accumulator holds 8 column blocks from kOff");                               \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " "                                                \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                    \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "                                         \
        "%32, %33, p, 1, 1, %35, %36;\n}\n"                                                                          \
        : PATHATTN_WGMMA_D32                                                                                         \
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));                                    \
  }                                                                                                                  \
  template <int kTransA, int kTransB, int kOff = 0, int NT>                                                          \
  __device__ __forceinline__ void wgmma_m64n32k16_ss(float(&d)[NT][4], uint64_t desc_a, uint64_t desc_b,             \
                                                     int accumulate, TY##_tag) {                                     \
    static_assert(kOff + 4 <= NT, "the accumulator holds 4 column blocks from kOff");                               \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." #TY "." #TY " "                                                \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "                                                  \
        "%16, %17, p, 1, 1, %19, %20;\n}\n"                                                                          \
        : PATHATTN_WGMMA_D16                                                                                         \
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));                                    \
  }
PATHATTN_WGMMA_SS(bf16)
PATHATTN_WGMMA_SS(f16)
#undef PATHATTN_WGMMA_SS
#undef PATHATTN_WGMMA_D16

// TF32 (m64n64k8, f32 accumulation): A and B both K-major (the instruction has no transposed form below 16 bits),
// B from a descriptor, A from a descriptor (SS) or from registers (RS: this warp's 16 rows, the fragment of mma.sync
// m16n8k8.tf32: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)). For the preprocess's next form
// (docs/perf/notes.md "Preprocess v8"); tests/cuda/test_cuda_wgmma_tf32.cu checks both against f64.
__device__ __forceinline__ void wgmma_m64n64k8_tf32_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                                       int accumulate) {
  constexpr int kOff = 0;  // (PATHATTN_WGMMA_D32 names d[kOff ..])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : PATHATTN_WGMMA_D32
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_m64n64k8_tf32_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int accumulate) {
  constexpr int kOff = 0;  // (PATHATTN_WGMMA_D32 names d[kOff ..])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
      : PATHATTN_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
#undef PATHATTN_WGMMA_D32

// Descriptor of k8 step kk of a K-major f32 operand of 64 rows and 64 columns (k) in swizzle.h's swz128<4> layout
// (two boxes of 32 columns, 64 x 128 bytes each, 1024-byte aligned): box kk / 4, then 32 bytes per step inside the
// swizzled rows (the hardware applies the XOR to the final address, as for the 16-bit k16 steps above).
__device__ __forceinline__ uint64_t wgmma_desc_tf32_k8(const float* tile, int kk) {
  return wgmma_desc_sw128(smem_addr(tile + (kk / 4) * 64 * 32)) + 2 * (kk % 4);
}

// acc[64 x 64] (+)= A[64 x 64] (registers: four k16 steps) * B[64 x 64] from one 128-byte-swizzled tile: B K-major
// (kTransB = 0: a k16 step is 32 bytes along the swizzled rows, +2 in the descriptor's 16-byte units) or MN-major
// (kTransB = 1: a step is 16 rows, 2048 bytes, +128). accumulate = false overwrites acc. The backward main kernel's
// products (bwd_main_pair.cuh).
template <int kTransB, typename T>
__device__ __forceinline__ void wgmma_k64(float (&acc)[8][4], const uint32_t (&a)[4][4], const T* b, bool accumulate) {
  const uint64_t desc = wgmma_desc_sw128(smem_addr(b));
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n64k16_rs<kTransB>(acc, a[kk], desc + (kTransB ? 128 : 2) * kk, accumulate || kk > 0,
                                typename WgmmaTag<T>::type{});
}

}  // namespace pathattn::cuda
