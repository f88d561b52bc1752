// Every backend x every operation, one table (ggml's test-backend-ops): {reference, cpu, cuda} x {forward,
// backward, decode} over one small case list. Each cell asks supports(in, backend, op) first and skips with its
// reason when the backend does not implement the operation for that case, so a new kernel arrives as a cell
// that stops skipping. The oracle is the checkpointed f64 recurrence of tests/recurrence.h, written apart from
// src/ref, so that the reference row is tested too; kcache (not produced by the recurrence) is compared with the
// reference's.
//
// Tolerances (tests/tolerances.h): reference (f64) kRecurrenceVsReference; cpu (f32) kF32VsF64, with
// kF32ExactZeroAbs for outputs that are zero in exact arithmetic. The CUDA cells here are given host tensors and
// report supports()'s answer for them; the CUDA kernels on device tensors, with FlashAttention's low-precision rule,
// are tested by tests/cuda/test_cuda_{forward,backward,decode}.cpp (label gpu).
//
// What the other files keep: test_cpu_vs_reference.cpp the wide case table and adversarial inputs of the CPU path,
// threads, layouts, a 4096-token sequence; test_decode.cpp decode's step patterns, a forward prefill continued by
// decode, and the cache's argument errors; test_reference.cpp the reference against brute force and finite
// differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "decode_steps.h"
#include "harness.h"
#include "recurrence.h"
#include "tolerances.h"

namespace pathattn::test {
namespace {

// The common case list: each axis (T around the chunk of 64, GQA, DV != D, gate, beta regimes, varlen, permuted
// inputs, B > 1, a head dimension above the CPU path's maximum) at least once, small enough for the f64 rows.
std::vector<Spec> cases() {
  using B = BetaDist;
  return {
      {.B = 2, .T = 1, .H = 1, .HQ = 1, .D = 16, .DV = 16, .seed = 51},
      {.B = 1, .T = 65, .H = 1, .HQ = 4, .D = 32, .DV = 16, .gate = true, .beta = B::near2, .seed = 52},
      {.B = 2, .T = 130, .H = 2, .HQ = 2, .D = 64, .DV = 64, .beta = B::near1, .permuted = true, .seed = 53},
      {.B = 1, .T = 100, .H = 1, .HQ = 2, .D = 128, .DV = 128, .gate = true, .beta = B::exact2, .seed = 54},
      {.B = 1, .T = 140, .H = 1, .HQ = 2, .D = 16, .DV = 16, .gate = true, .seqlens = {1, 70, 69}, .seed = 55},
      {.B = 1, .T = 9, .H = 1, .HQ = 1, .D = 272, .DV = 16, .seed = 56},
  };
}

struct Cell {
  Backend backend;
  Op op;
  Spec spec;
};

std::string cell_name(const Cell& c) {
  return std::string(backend_name(c.backend)) + "_" + op_name(c.op) + "_" + c.spec.name() + "_s" +
         std::to_string(c.spec.seed);
}

// gtest prints a cell with this (instead of its bytes).
void PrintTo(const Cell& c, std::ostream* os) { *os << cell_name(c); }

std::vector<Cell> cells() {
  std::vector<Cell> t;
  for (Backend b : {Backend::reference, Backend::cpu, Backend::cuda})
    for (Op op : {Op::forward, Op::backward, Op::decode})
      for (const Spec& s : cases()) t.push_back({b, op, s});
  return t;
}

// One compared output: the backend's and the oracle's.
struct Compared {
  const char* name;
  std::vector<double> got, want;
};

// Each output within the backend's tolerance of the oracle, NaN never passing; prints the worst ratio to the bound.
void expect_close(const std::vector<Compared>& xs, Backend b) {
  const bool f64 = b == Backend::reference;
  const double rel = f64 ? tol::kRecurrenceVsReference : tol::kF32VsF64;
  const double abs = f64 ? tol::kRecurrenceVsReferenceAbs : 0.0;
  double worst = 0;
  const char* worst_name = "none";
  for (const Compared& x : xs) {
    ASSERT_EQ(x.got.size(), x.want.size()) << x.name;
    if (!f64 && max_abs_err(x.want, std::vector<double>(x.want.size(), 0.0)) == 0.0) {  // zero in exact arithmetic
      EXPECT_LT(max_abs_err(x.got, x.want), tol::kF32ExactZeroAbs) << x.name << " must be 0";
      continue;
    }
    const double r = bound_ratio(x.got, x.want, rel, abs);
    EXPECT_LE(r, 1.0) << x.name << ": relative error " << rel_err(x.got, x.want) << ", tolerance " << rel;
    if (!(r <= worst)) worst = r, worst_name = x.name;
  }
  std::printf("    worst ratio to the bound %.2e (%s)\n", worst, worst_name);
}

// Runs one cell on inputs of type S (f64 for the reference, f32 otherwise) and compares it with the oracle.
template <typename S>
void run_cell(const Cell& cell, const Problem64& P, const std::vector<double>& dout, const RecurrenceResult& want) {
  const Spec& s = P.spec;
  Case<S> c(P);
  c.dout.fill_from(dout);
  if (cell.op == Op::decode) {  // the whole sequence in steps of 1, a few, and the rest (over a chunk when T > 70)
    std::vector<int64_t> steps;
    for (int64_t t = 0, k = 0; t < s.T; ++k) {
      const int64_t S_ = std::min<int64_t>(s.T - t, k % 3 == 0 ? 1 : k % 3 == 1 ? 5 : 70);
      steps.push_back(S_);
      t += S_;
    }
    if constexpr (std::is_same_v<S, float>) {
      DecodeState cache(s, s.T);
      Buffer<float> o({s.B, s.T, s.HQ, s.DV}, DType::f32), lse({s.B, s.T, s.HQ}, DType::f32);
      decode_in_steps(c, cache, 0, steps, o, lse);
      Case<double> r(P);
      r.forward(Backend::reference);
      expect_close({{"o", o.to_vector(), want.o}, {"lse", lse.to_vector(), want.lse},
                    {"cache.k", cache.k.to_vector(), r.kcache.to_vector()}},
                   cell.backend);
      EXPECT_TRUE(o.guards_intact() && lse.guards_intact() && cache.k.guards_intact() && cache.v.guards_intact());
    } else {
      FAIL() << "supports() allowed decode on " << backend_name(cell.backend) << " but this table decodes in f32 only";
    }
    return;
  }
  c.forward(cell.backend);
  if (cell.op == Op::forward) {
    Case<double> r(P);
    r.forward(Backend::reference);
    expect_close({{"o", c.o.to_vector(), want.o}, {"lse", c.lse.to_vector(), want.lse},
                  {"kcache", c.kcache.to_vector(), r.kcache.to_vector()}},
                 cell.backend);
  } else {
    c.backward(cell.backend);
    std::vector<Compared> xs = {{"dq", c.dq.to_vector(), want.dq},       {"dk", c.dk.to_vector(), want.dk},
                                {"dv", c.dv.to_vector(), want.dv},       {"dw", c.dw.to_vector(), want.dw},
                                {"dbeta", c.dbeta.to_vector(), want.dbeta}};
    if (s.gate) xs.push_back({"dg", c.dg.to_vector(), want.dg});
    expect_close(xs, cell.backend);
  }
  EXPECT_TRUE(c.guards_intact()) << "a write outside an output";
}

class BackendOps : public ::testing::TestWithParam<Cell> {};

TEST_P(BackendOps, MatchesTheF64Recurrence) {
  const Cell& cell = GetParam();
  const Problem64 P = rounded_to_f32(cell.spec);
  // The backend's inputs as this binary can give them: host tensors, f64 for the reference, f32 for the others.
  const bool f64 = cell.backend == Backend::reference;
  Case<double> in64(P);
  Case<float> in32(P);
  const Support sup = supports(f64 ? in64.in : in32.in, cell.backend, cell.op);
  if (!sup) GTEST_SKIP() << backend_name(cell.backend) << " " << op_name(cell.op) << ": " << sup.reason;
  // The f32 Case's dO (exact in f64) is what every backward and the oracle see.
  const std::vector<double> dout = in32.dout.to_vector();
  const RecurrenceResult want = run_recurrence(P, dout, {});
  if (f64)
    run_cell<double>(cell, P, dout, want);
  else
    run_cell<float>(cell, P, dout, want);
}

INSTANTIATE_TEST_SUITE_P(Table, BackendOps, ::testing::ValuesIn(cells()),
                         [](const auto& info) { return cell_name(info.param); });

}  // namespace
}  // namespace pathattn::test
