// The checkpointed recurrence of tests/recurrence.h, which is both the f64 oracle of the long GPU case and the
// low-precision baseline of the CUDA backward's tolerance rule (tests/cuda/test_cuda_backward.cpp): in f64 it must
// give the reference's outputs and gradients (whatever the checkpoint interval, block size and thread count), with
// every beta = 0 plain softmax attention's, and in bf16 / f16 errors of the size those precisions make.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <string>

#include "harness.h"
#include "recurrence.h"
#include "softmax_attention.h"
#include "tolerances.h"

namespace pathattn::test {
namespace {

struct RecCase {
  Spec s;
  int64_t K = 0;            // checkpoint interval (0: the default)
  int64_t block_rows = 64;  // rows per work item: small values give several blocks (and parallel regions) at small T
  bool dlse = false;        // the loss uses lse too
  std::string name() const {
    return s.name() + "_K" + std::to_string(K) + "_rows" + std::to_string(block_rows) + (dlse ? "_dlse" : "");
  }
};
void PrintTo(const RecCase& c, std::ostream* os) { *os << c.name(); }

// got within kRecurrenceVsReference of want (relative L2, with the absolute floor for exact zeros).
void expect_equal_f64(const char* what, const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double ratio = bound_ratio(got, want, tol::kRecurrenceVsReference, tol::kRecurrenceVsReferenceAbs);
  EXPECT_LE(ratio, 1.0) << what << ": relative error " << rel_err(got, want) << " (max abs " << max_abs_err(got, want)
                        << ")";
}

class RecurrenceF64 : public ::testing::TestWithParam<RecCase> {};

// Outputs and every gradient against Backend::reference on the same f64 inputs and output gradients.
TEST_P(RecurrenceF64, MatchesReference) {
  const RecCase& c = GetParam();
  Problem64 P(c.s);
  Case<double> r(P);
  r.forward(Backend::reference, false);
  if (c.dlse)
    r.backward_with_lse(Backend::reference);
  else
    r.backward(Backend::reference);
  const OutputGrads og = draw_output_grads(c.s);
  const RecurrenceResult x =
      run_recurrence(P, og.dout, c.dlse ? og.dlse : std::vector<double>{}, {.checkpoint = c.K, .block_rows = c.block_rows});
  expect_equal_f64("o", x.o, r.o.to_vector());
  expect_equal_f64("lse", x.lse, r.lse.to_vector());
  expect_equal_f64("dq", x.dq, r.dq.to_vector());
  expect_equal_f64("dk", x.dk, r.dk.to_vector());
  expect_equal_f64("dv", x.dv, r.dv.to_vector());
  expect_equal_f64("dw", x.dw, r.dw.to_vector());
  expect_equal_f64("dbeta", x.dbeta, r.dbeta.to_vector());
  if (c.s.gate) expect_equal_f64("dg", x.dg, r.dg.to_vector());
}

std::vector<RecCase> f64_cases() {
  std::vector<RecCase> c;
  // Every sequence of length 1 (dq = dk = dg = dw = dbeta = 0), with and without dlse; two tokens, K = 1.
  c.push_back({{.B = 2, .T = 1, .H = 2, .HQ = 2, .D = 16, .DV = 16, .seed = 1}});
  c.push_back({{.B = 2, .T = 1, .H = 1, .HQ = 2, .D = 16, .DV = 16, .gate = true, .seed = 2}, 0, 64, true});
  c.push_back({{.B = 2, .T = 2, .H = 1, .HQ = 1, .D = 16, .DV = 16, .gate = true, .seed = 3}, 1});
  // GQA 2:1 and the gate; K not dividing T, K = T - 1, K >= T; several blocks of rows.
  for (int64_t K : {5, 36, 64})
    c.push_back({{.B = 1, .T = 37, .H = 2, .HQ = 4, .D = 16, .DV = 16, .gate = true, .seed = 4}, K, 4, K == 5});
  // DV != D (the recurrence does not care), more heads per group.
  c.push_back({{.B = 2, .T = 40, .H = 1, .HQ = 3, .D = 16, .DV = 8, .seed = 5}, 3, 8});
  // Varlen with length-1 sequences, checkpoint segments that straddle sequence ends of the packed tensor.
  c.push_back({{.B = 1, .T = 34, .H = 2, .HQ = 4, .D = 16, .DV = 16, .gate = true, .seqlens = {1, 9, 1, 17, 1, 5},
                .seed = 6}, 4, 4, true});
  // Every beta distribution: near 0, 1 (singular H_t), 2, in [1.9, 2], exactly 0, exactly 2.
  for (BetaDist bd : {BetaDist::uniform, BetaDist::near0, BetaDist::near1, BetaDist::near2, BetaDist::high,
                      BetaDist::exact0, BetaDist::exact2})
    c.push_back({{.B = 1, .T = 23, .H = 1, .HQ = 2, .D = 16, .DV = 16, .gate = true, .beta = bd, .seed = 7}, 3, 4,
                 bd == BetaDist::near1 || bd == BetaDist::exact2});
  return c;
}
INSTANTIATE_TEST_SUITE_P(Cases, RecurrenceF64, ::testing::ValuesIn(f64_cases()),
                         [](const auto& info) { return info.param.name(); });

// With every beta = 0 PaTH is softmax attention: the recurrence must give plain attention's outputs and gradients
// (computed by code that has no Householder step), and dw = 0 exactly (every term of Eq. 8 carries beta_t).
TEST(RecurrenceF64, PlainSoftmaxWhenBetaZero) {
  const Spec s{.B = 1, .T = 30, .H = 2, .HQ = 4, .D = 16, .DV = 16, .gate = true, .seqlens = {1, 12, 1, 16},
               .beta = BetaDist::exact0, .seed = 8};
  Problem64 P(s);
  const OutputGrads og = draw_output_grads(s);
  const RecurrenceResult x = run_recurrence(P, og.dout, og.dlse, {.checkpoint = 5, .block_rows = 4});
  const SoftmaxAttention a = softmax_attention(P, og.dout, og.dlse);
  expect_equal_f64("o", x.o, a.o);
  expect_equal_f64("lse", x.lse, a.lse);
  expect_equal_f64("dq", x.dq, a.dq);
  expect_equal_f64("dk", x.dk, a.dk);
  expect_equal_f64("dv", x.dv, a.dv);
  expect_equal_f64("dg", x.dg, a.dg);
  EXPECT_EQ(max_abs_err(x.dw, std::vector<double>(x.dw.size(), 0.0)), 0.0) << "dw must be exactly 0 when beta = 0";
}

// Bit for bit the same results whatever the checkpoint interval and the thread count: every sum over keys is
// reduced in a fixed block order, and recomputing a segment repeats the forward's operations exactly.
TEST(Recurrence, ReproducibleAcrossCheckpointsAndThreads) {
  const Spec s{.B = 1, .T = 150, .H = 1, .HQ = 2, .D = 16, .DV = 16, .gate = true, .seed = 9};
  Problem64 P(s);
  const OutputGrads og = draw_output_grads(s);
  const int threads = omp_get_max_threads();
  for (DType dt : {DType::f64, DType::bf16}) {
    omp_set_num_threads(1);
    const RecurrenceResult a = run_recurrence(P, og.dout, og.dlse, {.operands = dt, .checkpoint = 7, .block_rows = 8});
    omp_set_num_threads(2);
    const RecurrenceResult b = run_recurrence(P, og.dout, og.dlse, {.operands = dt, .checkpoint = 0, .block_rows = 8});
    omp_set_num_threads(threads);
    for (auto m : {&RecurrenceResult::o, &RecurrenceResult::lse, &RecurrenceResult::dq, &RecurrenceResult::dk,
                   &RecurrenceResult::dv, &RecurrenceResult::dw, &RecurrenceResult::dbeta, &RecurrenceResult::dg})
      EXPECT_TRUE(a.*m == b.*m) << dtype_name(dt) << ": results differ between K = 7, 1 thread and K = default, 2 threads";
  }
}

// The low-precision baseline's errors against f64 are those of its precision: not zero (it does round) and not
// large (its math is right). A sanity check of the yardstick, not a tight bound.
TEST(Recurrence, LowPrecisionErrorsInExpectedRange) {
  const Spec s{.B = 1, .T = 200, .H = 1, .HQ = 2, .D = 64, .DV = 64, .gate = true, .seed = 10};
  Problem64 P(s);
  const OutputGrads og = draw_output_grads(s);
  const RecurrenceResult ref = run_recurrence(P, og.dout, og.dlse);
  struct Variant {
    DType dt;
    bool w_bf16;
    double lo, hi;
  };
  for (const Variant& v : {Variant{DType::bf16, false, tol::kBf16BaselineMin, tol::kBf16BaselineMax},
                           Variant{DType::bf16, true, tol::kBf16BaselineMin, tol::kBf16BaselineMax},
                           Variant{DType::f16, false, tol::kF16BaselineMin, tol::kF16BaselineMax}}) {
    const RecurrenceResult x = run_recurrence(P, og.dout, og.dlse, {.operands = v.dt, .w_bf16 = v.w_bf16});
    std::printf("%s%s:", dtype_name(v.dt), v.w_bf16 ? " (w bf16)" : "");
    const std::pair<const char*, std::vector<double> RecurrenceResult::*> outs[] = {
        {"o", &RecurrenceResult::o},     {"lse", &RecurrenceResult::lse}, {"dq", &RecurrenceResult::dq},
        {"dk", &RecurrenceResult::dk},   {"dv", &RecurrenceResult::dv},   {"dw", &RecurrenceResult::dw},
        {"dbeta", &RecurrenceResult::dbeta}, {"dg", &RecurrenceResult::dg}};
    for (const auto& [name, m] : outs) {
      const double e = rel_err(x.*m, ref.*m);
      std::printf("  %s %.2e", name, e);
      EXPECT_GE(e, v.lo) << name << " in " << dtype_name(v.dt) << ": too precise, is anything rounded?";
      EXPECT_LE(e, v.hi) << name << " in " << dtype_name(v.dt) << ": too far from f64";
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace pathattn::test
