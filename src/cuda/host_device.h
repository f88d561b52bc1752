// PATHATTN_HD: a function that both the kernels and the host tests run (the schedules of cuda/fwd_blocks.h and
// cuda/bwd_blocks.h, the swizzle of cuda/swizzle.h): host and device, inlined, under nvcc; plain inline elsewhere.
#pragma once

#ifdef __CUDACC__
#define PATHATTN_HD __host__ __device__ __forceinline__
#else
#define PATHATTN_HD inline
#endif
