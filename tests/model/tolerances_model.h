// Tolerances of the model tests, with the reason for each (the project's rule: named, never ad hoc).
#pragma once

#include <cstdint>

namespace pathattn::model::test_tol {

// f64 KV-cache decoding against the f64 full forward (the op's reference path on prefixes): different summation
// orders of O(T D) terms of size O(1) in f64 (eps 1e-16); 1e-10 leaves a margin of 1e4 and still fails any
// wrong term (O(1e-2) or more).
constexpr double kF64Paths = 1e-10;

// f32 decoding through the op's decode against the op's f32 full forward: the library's own f32-vs-f64 bound
// (tests/tolerances.h kF32VsF64, docs/spec.md §6), relative to the output's scale; each side is within it of the
// f64 result.
constexpr double kF32VsF64 = 1e-4;

// The model under bf16 autocast against the same model in f32 (logits, relative to their largest magnitude):
// bf16 keeps 8 significant bits (unit roundoff 2^-9 ~ 2e-3) and a 2-layer forward rounds its operands about 8
// times in sequence (norm output, q/k/v, attention output, o_proj, MLP in and out, head), so about 2e-2 at
// worst; a wrong or missing term moves logits by O(1) of their scale.
constexpr double kBf16VsF32 = 3e-2;

// A model parameter whose gradient has a few elements, each a sum over every token (the biases of the beta and gate
// projections: one element per head), against the f64 model (tests/model/test_model_cuda.cpp). Its relative error is
// the terms' rounding over a small, cancelling total: one draw, which two legitimate low-precision computations give
// several times apart. Measured on the op's per-head sum of dbeta at T = 10 (B 4, GQA 2:1, D 64): inputs rounded to
// bf16 with exact math vs every product operand rounded, 2.1e-3 vs 4.2e-4 on one input, 4.8e-3 vs 8.5e-3 on another
// (while the whole dbeta tensors agree within 1.1-1.4x). So FlashAttention's ratio rule (tests/tolerances.h kLowPrecisionFactor) is not a test for such a gradient
// alone; the same projection's weight, whose gradient carries the same dbeta times the layer's input, keeps it. What
// is left to check here is the routing: a lost, misrouted, doubled or sign-flipped gradient is off by 0.5 or more,
// rounding (observed up to 0.038 on the GPU, 0.016 on the CPU under bf16 autocast) by an order of magnitude less.
constexpr int64_t kFewSummedElements = 64;
constexpr double kGradientRouting = 0.25;

// Overfitting one batch: the masked loss must fall below this fraction of its start (ln 5 ~ 1.6 for flip-flop);
// a model that does not learn stays near 1.
constexpr double kOverfitRatio = 0.2;

// Tiny end-to-end flip-flop run: read-bit error must be below this (chance is 0.5).
constexpr double kTinyRunError = 0.25;

// Gradient accumulation (two micro-batches of 2 sequences) against one batch of the same 4 sequences, f32: the same
// terms summed in another order (two half-batch means averaged vs one mean; weight gradients summed over 48 vs 96
// rows in two parts), so f32 rounding of sums of ~1e2 terms: ~1e-6 of the largest gradient of a tensor. 1e-5
// leaves a margin of 10; a wrong weighting (no division by the micro-batch count) is off by a factor of 2.
constexpr double kAccumVsBatch = 1e-5;

// Loss by position (windows run 2 + 1 at a time) against one forward of all 3 windows, f32 and relative to each
// position's summed loss: different batch shapes may take different BLAS blockings (f32 rounding, ~1e-7 per
// operation over a 2-layer forward); a wrong position or window is off by O(1).
constexpr double kLossByPosition = 1e-5;

// Sampling frequencies over kSampleDraws draws against the filtered distribution: a binomial frequency has a standard
// deviation of at most sqrt(0.25 / 4000) ~ 0.008, so 0.04 is 5 of them (a false failure about once in 10^6 runs),
// while a wrong filter or temperature moves a frequency by 0.1 or more in the tests' examples.
constexpr int kSampleDraws = 4000;
constexpr double kSampleFreq = 0.04;

}  // namespace pathattn::model::test_tol
