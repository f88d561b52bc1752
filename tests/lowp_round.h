// Rounding a float to bf16 or f16 precision (round to nearest, ties to even), returned as a float, without CUDA
// headers: the low-precision baselines must build in the CPU tests too (tests/recurrence.h). Equal bit for bit to
// __float2bfloat16_rn / __float2half_rn followed by the conversion back (checked in test_cuda_backward, which has
// the CUDA headers), except that a NaN stays the NaN it was instead of becoming the canonical one.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "pathattn/pathattn.h"

namespace pathattn::test {

// bf16 is the upper half of a float: add half an ulp of the kept part (less one, plus the kept part's lowest bit:
// ties go to even) and clear the lower half. Overflow carries into the exponent and gives inf, as it should.
inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return x;  // NaN: adding would turn a payload into inf
  u += 0x7FFFu + ((u >> 16) & 1u);
  u &= 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// f16 keeps 10 of float's 23 mantissa bits down to 2^-14 (its smallest normal); below that its subnormals are the
// multiples of 2^-24. Above 65504 (the largest f16) anything that rounds up overflows to inf.
inline float round_f16(float x) {
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  float r;
  if (a < 0x1p-14f) {
    // In [0.5, 1) a float's ulp is 2^-24, so this addition rounds a to the f16 subnormal grid, ties to even, and
    // the subtraction is exact (no -ffast-math in the tests: the compiler may not fold the two).
    r = (a + 0.5f) - 0.5f;
  } else {
    uint32_t u;
    std::memcpy(&u, &a, 4);
    u += 0xFFFu + ((u >> 13) & 1u);  // as round_bf16, dropping 13 bits instead of 16
    u &= ~0x1FFFu;
    std::memcpy(&r, &u, 4);
    if (r > 65504.f) r = INFINITY;
  }
  return std::copysign(r, x);
}

// A float rounded to `dt` (bf16, f16); f32 and f64 leave it as it is.
inline float round_to(float x, DType dt) {
  if (dt == DType::bf16) return round_bf16(x);
  if (dt == DType::f16) return round_f16(x);
  return x;
}

}  // namespace pathattn::test
