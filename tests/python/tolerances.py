# Tolerances of the Python tests, with the reason for each (docs/spec.md §6; the C++ ones are in tests/tolerances.h).

# f32 op against the f32 PyTorch reference loop: both carry 6e-8 relative rounding per operation over
# O(T D) dependent steps at T <= 64, D <= 32; docs/spec.md §6 asks f32 CPU code to be well under 1e-4 relative.
F32_VS_REFERENCE_RTOL = 1e-4
F32_VS_REFERENCE_ATOL = 1e-5

# f64 op against the f64 PyTorch reference loop: both are the same math in f64 (rounding ~1e-16 per step).
F64_VS_REFERENCE_ATOL = 1e-10

# torch.autograd.gradcheck in f64: central differences with eps = 1e-6 carry truncation O(eps^2) ~ 1e-12 and
# cancellation O(1e-16 / eps) ~ 1e-10 relative; 1e-6 leaves a 1e4 margin and still fails any wrong term.
GRADCHECK_EPS = 1e-6
GRADCHECK_ATOL = 1e-6
GRADCHECK_RTOL = 1e-5

# Unit norm of the layer's w in f32: one normalisation, a few ulps of 6e-8.
UNIT_NORM_ATOL = 1e-5

# CUDA (bf16/f16 tensor-core operands) against the f64 reference: FlashAttention's rule, the error must be at most
# this factor times the error of the same math done plainly in that precision, plus an absolute term (the same
# numbers as kLowPrecisionFactor / kLowPrecisionAbs in tests/tolerances.h).
LOW_PRECISION_FACTOR = 2.0
LOW_PRECISION_ATOL = 1e-3

# The CUDA backward in its free summation order against the fixed one: only the order of f32 sums changes, which
# moves a bf16 gradient element by at most about one bf16 ulp (2^-8 relative) when the rounding tips; relative L2
# of the difference well under 2^-7. A missed or doubled contribution is O(1).
SUMMATION_ORDER_BF16_RTOL = 2.0 ** -7

# The CUDA decode (f32 on CUDA cores) against the CPU decode from the same cache on the same bf16-rounded inputs: both
# f32 with different summation orders, a few eps * sqrt(terms) ~ 1e-6 relative per step, not amplified by the carry
# (|H_t| <= 1), so far below 1e-4 in relative L2; a wrong row, head or carry is O(1e-2) or more (the same number as
# kCudaDecodeVsCpu in tests/tolerances.h). o is stored in bf16, which adds at most its unit roundoff (round to
# nearest) per element, so at most that in relative L2.
CUDA_DECODE_VS_CPU_RTOL = 1e-4
BF16_UNIT_ROUNDOFF = 2.0 ** -8
