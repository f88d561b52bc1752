// FlashAttention's tolerance rule for a low-precision result (tests/tolerances.h kLowPrecisionFactor): its error
// against the f64 reference must be at most the factor times the error of the same math done plainly in that
// precision (the baseline), plus kLowPrecisionAbs; relative L2 over the whole tensor. Prints every comparison so
// that the margins are visible in each run.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "harness.h"
#include "tolerances.h"

namespace pathattn::test {

inline void expect_within(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                          const std::vector<double>& base) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_EQ(base.size(), ref.size()) << what;
  const double e_base = rel_err(base, ref), e_got = rel_err(got, ref);
  const double ratio = bound_ratio(got, ref, tol::kLowPrecisionFactor * e_base, tol::kLowPrecisionAbs);
  EXPECT_LE(ratio, 1.0) << what << ": relative error " << e_got << " vs low-precision baseline " << e_base
                        << " (max abs " << max_abs_err(got, ref) << ")";
  std::printf("  %-7s rel err %.3e  baseline %.3e  (ratio to bound %.3f)\n", what, e_got, e_base, ratio);
}

}  // namespace pathattn::test
