// Every tolerance of the test suite, with the reason for each (docs/spec.md §6).
#pragma once

namespace pathattn::test::tol {

// f64 reference against the explicit D x D product: both are f64 with O(T D) rounding steps of 1e-16.
constexpr double kRefVsBruteForce = 1e-12;

// Central finite differences in f64 with step h = 1e-6: truncation O(h^2) ~ 1e-12 plus cancellation
// O(eps / h) ~ 1e-10 relative to the loss; 1e-6 relative leaves a margin of 1e4 and still fails any real
// error in a derivative (a wrong term is O(1) relative).
constexpr double kFiniteDifference = 1e-6;
constexpr double kFiniteDifferenceStep = 1e-6;
// ...plus an absolute floor for gradients that are themselves tiny (dw with beta near 0 is O(beta)): the
// cancellation noise of a difference quotient is about eps |loss| / h ~ 1e-10 per element, so 1e-8 over the
// whole tensor (L2) is noise, while a wrong term of a gradient of size 1e-3 is 1e5 times larger.
constexpr double kFiniteDifferenceAbs = 1e-8;

// f32 CPU paths against the f64 reference: f32 carries 6e-8 relative per operation; the chunked path's
// longest dependency chains (T / C chunk products, sums over T keys) stay far below 1e-4 (docs/spec.md §6).
constexpr double kF32VsF64 = 1e-4;

// ...except for a gradient that is exactly zero in exact arithmetic, where a relative error means nothing: with
// every sequence of length 1 the softmax has one key, o = v and dl = dO.v - dO.o = 0, so dq = dk = dg = 0. f32
// computes dl as the difference of two equal dot products of size |dO| |v| ~ sqrt(DV) and leaves about
// eps * sqrt(DV) ~ 1e-6 per element (measured: up to 4e-7); a real error there is O(1). Max abs per element.
constexpr double kF32ExactZeroAbs = 1e-5;

// The CPU path with 1 thread against 2 threads: only the order of f32 sums may change (a reduction split over
// threads), which moves a result by a few eps * sqrt(terms) ~ 1e-6 relative at T ~ 1000; a race or a missed
// or doubled contribution is O(1e-2) or more.
constexpr double kThreadCountRounding = 1e-5;

// Permuted (non-contiguous) output views against contiguous ones: the layout may at most change how a path packs
// and therefore sums (the same reordering as above); a wrong stride is O(1).
constexpr double kLayoutRounding = kThreadCountRounding;

// Low precision (bf16/f16 tensor-core operands) against the f64 reference: FlashAttention's rule, the error
// must be at most this factor times the error of the same math done plainly in that precision, plus kAbs.
// "Plainly" for the CUDA forward is defined in tests/cuda/lowp_baseline.h (the f32 key-cache recurrence with every
// product operand rounded to bf16/f16, f32 accumulation), for the backward in tests/recurrence.h (the same, with the
// reverse sweep of Eq. 5-9); errors are relative L2 over the whole output tensor.
constexpr double kLowPrecisionFactor = 2.0;
constexpr double kLowPrecisionAbs = 1e-3;

// The CUDA decode (f32 on CUDA cores, kernels/decode.cuh) against the CPU decode on the same inputs (q, k, v already
// rounded to bf16 / f16, the same f32 cache): both are f32 with different summation orders (team shuffles vs BLAS,
// per-split partial softmax merged by maxima), a few eps * sqrt(terms) ~ 1e-6 relative per step; the carried cache
// does not amplify it (|H_t| <= 1 for beta in [0, 2]), so 1,000 steps stay far below 1e-4, while a missed or doubled
// carry, a wrong row or head is O(1e-2) or more. Outputs stored in bf16 / f16 (o) add their own rounding, at most
// the unit roundoff below per element (round to nearest), hence at most that in relative L2.
constexpr double kCudaDecodeVsCpu = 1e-4;

// The CUDA backward in its free (atomic) summation order against its fixed one: only the order of f32 sums changes,
// which moves a bf16 gradient element by about one bf16 ulp (2^-8 relative) where the rounding tips; relative L2 of
// the difference well under 2^-7, while a missed or doubled contribution is O(1). (tests/python/tolerances.py
// SUMMATION_ORDER_BF16_RTOL is the same number.)
constexpr double kSummationOrderBf16 = 0x1p-7;
constexpr double kBf16UnitRoundoff = 0x1p-8, kF16UnitRoundoff = 0x1p-11;

// The checkpointed f64 recurrence (tests/recurrence.h) against the reference (Backend::reference): the same f64
// arithmetic summed in another order (blocks of rows, four partial sums per dot product), which moves a result by a
// few eps * sqrt(terms) ~ 1e-14 relative at the sizes tested; a wrong, missing or doubled term is O(1e-3) or more.
// Also plain softmax attention against the recurrence with every beta = 0 (the same sums, H_t = I).
constexpr double kRecurrenceVsReference = 1e-10;
// ...plus an absolute floor (L2 over the tensor) for gradients that are zero in exact arithmetic (dw with beta = 0,
// dq, dk, dg when every sequence has length 1): f64 leaves at most ~1e-16 per element there, if anything.
constexpr double kRecurrenceVsReferenceAbs = 1e-12;

// Sanity range of the low-precision baseline's errors against f64 (relative L2, o, lse and every gradient; not a
// bound on a kernel). The unit roundoff u is 2^-9 ~ 2e-3 for bf16 and 2^-11 ~ 4.9e-4 for f16; rounding every
// product operand leaves about u per output (measured at T = 200, D = 64: bf16 3e-3..5e-3, f16 4e-4..6e-4), lse
// less (u / 6 .. u / 3: it is O(log T) with an absolute error ~u). Below u / 30 the baseline would not be rounding
// what it claims (f32 alone gives ~1e-7); above 15 u its math would be wrong (a wrong term is O(1)).
constexpr double kBf16BaselineMin = 7e-5, kBf16BaselineMax = 3e-2;
constexpr double kF16BaselineMin = 2e-5, kF16BaselineMax = 7e-3;

}  // namespace pathattn::test::tol
