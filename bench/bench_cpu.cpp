// bench_cpu: how fast is PaTH attention on the CPU, next to causal softmax attention at the same shape?
//
// For B = 1, H = HQ = 4, D = DV = 64 and each T: the fast CPU path (Backend::cpu) and the reference
// (Backend::reference, only up to --max-ref-T: its backward keeps T^2 D / 2 floats per head), forward and
// forward+backward, and causal softmax attention composed from libtorch ops (matmul, masked softmax, matmul;
// autograd for the backward) with the same thread count. Times are medians of --reps runs after one warm-up;
// the fast path and the baseline are timed in turn so that a shared machine's load falls on both alike.
//
// FLOP model (per head, causal, counting only the useful lower triangle):
//   attention      QK^T + PV:                      2 T^2 (D + DV) / 2 = T^2 (D + DV)
//   carry GEMMs    two C x C x D GEMMs per pair:   2 * 2 T^2 D / 2    = 2 T^2 D     (PaTH only, docs/math.md Eq. 17)
//   backward       2.5 x forward (FlashAttention's convention), so forward+backward = 3.5 x forward.
// Softmax attention's GFLOP/s use the attention term only (libtorch computes the full square: it does twice the
// counted work). GFLOP/s = model FLOPs / time, so PaTH and softmax are compared on useful work.
//
// Usage: bench_cpu [--threads N] [--reps R] [--T 256,512,...] [--max-ref-T 1024] [--gate]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pathattn/pathattn.h"
#include "inputs.h"
#include "timing.h"

#ifdef PATHATTN_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

using pathattn::Backend;
using pathattn::DType;
using pathattn::bench::interleaved_medians;
using pathattn::bench::median_ms;

constexpr int64_t kB = 1, kH = 4, kHQ = 4, kD = 64, kDV = 64;

struct Options {
  int threads = 0;  // 0: all cores
  int reps = 5;
  int64_t max_ref_T = 1024;
  bool gate = false;
  std::vector<int64_t> Ts = {256, 512, 1024, 2048, 4096};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cpu: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") {
      o.threads = std::stoi(next());
    } else if (a == "--reps") {
      o.reps = std::max(1, std::stoi(next()));
    } else if (a == "--max-ref-T") {
      o.max_ref_T = std::stoll(next());
    } else if (a == "--gate") {
      o.gate = true;
    } else if (a == "--T") {
      o.Ts.clear();
      std::stringstream s(next());
      for (std::string x; std::getline(s, x, ',');) o.Ts.push_back(std::stoll(x));
    } else {
      std::fprintf(stderr,
                   "usage: bench_cpu [--threads N] [--reps R] [--T 256,512,...] [--max-ref-T 1024] [--gate]\n");
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

// Model FLOPs of one forward (see the header comment), all heads.
double path_fwd_flops(int64_t T) { return double(kB * kHQ) * (double(T) * T * (kD + kDV) + 2.0 * T * T * kD); }
double softmax_fwd_flops(int64_t T) { return double(kB * kHQ) * double(T) * T * (kD + kDV); }
constexpr double kFwdBwdFactor = 3.5;

// One PaTH problem in f32 with its outputs and gradients: q, k, v ~ N(0, 1), w unit-norm,
// beta = 2 sigmoid(N(0, 1)) (the layer's parametrisation), g = logsigmoid(1.5 + N(0, 1)) when gated.
struct PathProblem {
  int64_t T;
  std::vector<float> q, k, v, w, beta, g, o, lse, dout, dq, dk, dv, dw, dbeta, dg;
  pathattn::Inputs in;

  PathProblem(int64_t T_, bool gate) : T(T_) {
    pathattn::bench::InputDraws draw(T);
    draw.normal(q, kB * T * kHQ * kD);
    draw.normal(k, kB * T * kH * kD);
    draw.normal(v, kB * T * kH * kDV);
    draw.unit_rows(w, kB * T * kH, kD);
    draw.beta(beta, kB * T * kH);
    draw.normal(dout, kB * T * kHQ * kDV);
    for (auto* x : {&o, &dv}) x->assign(kB * T * (x == &o ? kHQ : kH) * kDV, 0.f);
    for (auto* x : {&dq, &dk, &dw}) x->assign(kB * T * (x == &dq ? kHQ : kH) * kD, 0.f);
    lse.assign(kB * T * kHQ, 0.f);
    dbeta.assign(kB * T * kH, 0.f);
    in.q = view(q, {kB, T, kHQ, kD});
    in.k = view(k, {kB, T, kH, kD});
    in.v = view(v, {kB, T, kH, kDV});
    in.w = view(w, {kB, T, kH, kD});
    in.beta = view(beta, {kB, T, kH});
    if (gate) {
      g.resize(kB * T * kHQ);
      for (float& x : g) x = -std::log1p(std::exp(-(1.5f + draw.n01(draw.rng))));
      dg.assign(g.size(), 0.f);
      in.g = view(g, {kB, T, kHQ});
    }
  }
  static pathattn::TensorView view(std::vector<float>& x, std::initializer_list<int64_t> sizes) {
    return pathattn::make_view(x.data(), DType::f32, sizes);
  }
  void forward(Backend b) {
    pathattn::ForwardOutputs out;
    out.o = view(o, {kB, T, kHQ, kDV});
    out.lse = view(lse, {kB, T, kHQ});
    pathattn::forward(in, out, b);
  }
  void backward(Backend b) {
    pathattn::Gradients gr;
    gr.dq = view(dq, {kB, T, kHQ, kD});
    gr.dk = view(dk, {kB, T, kH, kD});
    gr.dv = view(dv, {kB, T, kH, kDV});
    gr.dw = view(dw, {kB, T, kH, kD});
    gr.dbeta = view(dbeta, {kB, T, kH});
    if (in.g.defined()) gr.dg = view(dg, {kB, T, kHQ});
    pathattn::backward(in, view(o, {kB, T, kHQ, kDV}), view(lse, {kB, T, kHQ}), view(dout, {kB, T, kHQ, kDV}), gr,
                       b);
  }
};

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Row {
  int64_t T = 0;
  double path_fwd = NAN, path_fb = NAN, ref_fwd = NAN, ref_fb = NAN, sm_fwd = NAN, sm_fb = NAN;
  double check = NAN;  // relative L2 difference of o and dq, fast path vs reference (both f32)
};

#ifdef PATHATTN_BENCH_TORCH
// Causal softmax attention from libtorch ops, [B, HQ, T, D] layout (torch's matmul batches the leading dims).
struct SoftmaxProblem {
  torch::Tensor q, k, v, dout, future;
  double scale = 1.0 / std::sqrt(double(kD));
  explicit SoftmaxProblem(int64_t T) {
    torch::manual_seed(T);
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    q = torch::randn({kB, kHQ, T, kD}, f32).requires_grad_(true);
    k = torch::randn({kB, kHQ, T, kD}, f32).requires_grad_(true);
    v = torch::randn({kB, kHQ, T, kDV}, f32).requires_grad_(true);
    dout = torch::randn({kB, kHQ, T, kDV}, f32);
    future = torch::ones({T, T}, torch::kBool).triu(1);  // j > i: masked
  }
  torch::Tensor attend() {
    torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) * scale;
    return torch::matmul(torch::softmax(s.masked_fill(future, -INFINITY), -1), v);
  }
  void forward() {
    torch::NoGradGuard no_grad;  // an inference forward: no graph kept
    attend();
  }
  void forward_backward() {
    for (torch::Tensor* t : {&q, &k, &v}) t->mutable_grad() = torch::Tensor();
    attend().backward(dout);
  }
};
#endif

// One row of the table: the fast path and the baseline interleaved, then the reference on its own (slow).
Row bench_row(int64_t T, const Options& opt) {
  Row r;
  r.T = T;
  PathProblem p(T, opt.gate);
  std::vector<std::function<void()>> fs = {[&] { p.forward(Backend::cpu); },
                                           [&] {
                                             p.forward(Backend::cpu);
                                             p.backward(Backend::cpu);
                                           }};
#ifdef PATHATTN_BENCH_TORCH
  SoftmaxProblem sm(T);
  fs.push_back([&] { sm.forward(); });
  fs.push_back([&] { sm.forward_backward(); });
#endif
  const std::vector<double> med = interleaved_medians(opt.reps, fs);
  r.path_fwd = med[0];
  r.path_fb = med[1];
  if (med.size() == 4) {
    r.sm_fwd = med[2];
    r.sm_fb = med[3];
  }
  if (T <= opt.max_ref_T) {
    const std::vector<float> o_fast = p.o, dq_fast = p.dq;
    r.ref_fwd = median_ms(opt.reps, [&] { p.forward(Backend::reference); });
    r.ref_fb = median_ms(opt.reps, [&] {
      p.forward(Backend::reference);
      p.backward(Backend::reference);
    });
    r.check = std::max(rel_diff(o_fast, p.o), rel_diff(dq_fast, p.dq));
  }
  return r;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The machine is shared: the load average says whether the numbers were taken on a quiet machine.
std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string fmt(double x, const char* spec = "%.1f") {
  if (std::isnan(x)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, x);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  pathattn::set_num_threads(opt.threads);
  const int threads = pathattn::num_threads();
#ifdef PATHATTN_BENCH_TORCH
  at::set_num_threads(threads);
#endif

  std::printf("# bench_cpu: PaTH attention on the CPU vs causal softmax attention (libtorch ops)\n");
  std::printf("machine: %s, %d cores (omp_get_num_procs), threads used: %d (pathattn)", cpu_model().c_str(),
              omp_get_num_procs(), threads);
#ifdef PATHATTN_BENCH_TORCH
  std::printf(", %d (torch %s)\n", at::get_num_threads(), TORCH_VERSION);
#else
  std::printf(", libtorch not found: no softmax baseline\n");
#endif
#ifdef PATHATTN_BENCH_BLAS
  std::printf("pathattn OpenBLAS: on\n");
#else
  std::printf("pathattn OpenBLAS: off (loop GEMM)\n");
#endif
  // libgomp's waiting policy decides how idle threads wait at barriers; on a loaded machine it changed times by up
  // to 50x (2026-11-29, 2 shared cores: softmax f+b at T = 256 took 214 ms unset, 4.3 ms with passive).
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::printf("load average at start: %s; OMP_WAIT_POLICY=%s\n", loadavg().c_str(), wait_policy ? wait_policy : "(unset)");
  std::printf("shape: B = %lld, H = HQ = %lld, D = DV = %lld, f32, gate %s; median of %d after 1 warm-up (PaTH and softmax interleaved)\n",
              (long long)kB, (long long)kHQ, (long long)kD, opt.gate ? "on" : "off", opt.reps);
  std::printf("FLOP model per head: PaTH fwd = T^2 (D + DV) + 2 T^2 D, softmax fwd = T^2 (D + DV) (causal, "
              "useful work), fwd+bwd = 3.5 x fwd\n\n");

  std::printf("| T | PaTH fwd ms | PaTH f+b ms | ref fwd ms | ref f+b ms | softmax fwd ms | softmax f+b ms | "
              "fwd PaTH/softmax | f+b PaTH/softmax | PaTH f+b growth | PaTH fwd GFLOP/s | PaTH f+b GFLOP/s | "
              "softmax f+b GFLOP/s | fast vs ref |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  double prev_fb = NAN;
  int64_t prev_T = 0;
  for (int64_t T : opt.Ts) {
    const Row r = bench_row(T, opt);
    // Growth of PaTH f+b time from the previous T, normalised so that 1.00 means "exactly as T^2".
    const double growth = prev_T > 0 ? (r.path_fb / prev_fb) / (double(T) * T / (double(prev_T) * prev_T)) : NAN;
    std::printf("| %lld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", (long long)T,
                fmt(r.path_fwd).c_str(), fmt(r.path_fb).c_str(), fmt(r.ref_fwd).c_str(), fmt(r.ref_fb).c_str(),
                fmt(r.sm_fwd).c_str(), fmt(r.sm_fb).c_str(), fmt(r.path_fwd / r.sm_fwd, "%.2f").c_str(),
                fmt(r.path_fb / r.sm_fb, "%.2f").c_str(), fmt(growth, "%.2f").c_str(),
                fmt(path_fwd_flops(T) / r.path_fwd * 1e-6).c_str(),
                fmt(kFwdBwdFactor * path_fwd_flops(T) / r.path_fb * 1e-6).c_str(),
                fmt(kFwdBwdFactor * softmax_fwd_flops(T) / r.sm_fb * 1e-6).c_str(), fmt(r.check, "%.1e").c_str());
    std::fflush(stdout);
    prev_fb = r.path_fb;
    prev_T = T;
  }
  std::printf("\nload average at end: %s\n", loadavg().c_str());
  std::printf("PaTH f+b growth: (time(T) / time(previous T)) / (T / previous T)^2; 1.00 = grows exactly as T^2.\n");
  std::printf("fast vs ref: max relative L2 difference of o and dq between Backend::cpu and Backend::reference.\n");
  return 0;
}
