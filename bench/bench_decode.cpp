// bench_decode: how long does one decoding step take on the CPU, as the cache grows?
//
// For B = 1, H = HQ = 8, D = DV = 64 (f32), a cache of L tokens and a step of S new tokens per call:
//   fused  pathattn::decode (the core's chunk step, src/cpu/append.cpp): the S tokens attend to the carried cache
//          and to each other, then the cache is carried by their UT factor in place (one pass for S tokens);
//   torch  the same step composed from libtorch ops, token by token as docs/spec.md §4 writes it (what the model
//          did before it called the op): every cached key k <- k - beta (k . w) w, append k_t, softmax attention
//          over the cache, into preallocated tensors (no reallocation, so the comparison is the arithmetic and the
//          passes).
// Bytes: a step must at least read and write the cached keys (the carry) and read keys and values (attention),
// (3 D + DV) L H floats; GB/s below count that floor once per call (per token for torch it is S times that).
// Medians of --reps calls after a warm-up, fused and torch timed in turn; each timed call starts from length L.
//
// Usage: bench_decode [--threads N] [--reps R] [--L 256,1024,...] [--S 1,16]
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "inputs.h"
#include "pathattn/pathattn.h"
#include "timing.h"

#ifdef PATHATTN_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

using pathattn::DType;
using pathattn::make_view;

constexpr int64_t kB = 1, kH = 8, kD = 64, kDV = 64;

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> r;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) r.push_back(std::stoll(x));
  return r;
}

// A cache of Tmax = L + S rows (random, as carried keys would be) and S new tokens (bench/inputs.h).
struct Step {
  int64_t L, S, Tmax;
  std::vector<float> ck, cv, q, k, v, w, beta, o, lse;  // cache [B, Tmax, H, D]; new tokens [B, S, H, .]
  std::vector<int32_t> lengths;

  Step(int64_t L_, int64_t S_) : L(L_), S(S_), Tmax(L_ + S_) {
    pathattn::bench::InputDraws draw(L * 131 + S);
    draw.normal(ck, kB * Tmax * kH * kD);
    draw.normal(cv, kB * Tmax * kH * kDV);
    draw.normal(q, kB * S * kH * kD);
    draw.normal(k, kB * S * kH * kD);
    draw.normal(v, kB * S * kH * kDV);
    draw.unit_rows(w, kB * S * kH, kD);
    draw.beta(beta, kB * S * kH);
    o.assign(kB * S * kH * kDV, 0.f);
    lse.assign(kB * S * kH, 0.f);
    lengths.assign(kB, static_cast<int32_t>(L));
  }

  void fused() {
    lengths.assign(kB, static_cast<int32_t>(L));  // every timed call starts from length L
    pathattn::Inputs in;
    in.q = make_view(q.data(), DType::f32, {kB, S, kH, kD});
    in.k = make_view(k.data(), DType::f32, {kB, S, kH, kD});
    in.v = make_view(v.data(), DType::f32, {kB, S, kH, kDV});
    in.w = make_view(w.data(), DType::f32, {kB, S, kH, kD});
    in.beta = make_view(beta.data(), DType::f32, {kB, S, kH});
    pathattn::DecodeCache cache;
    cache.k = make_view(ck.data(), DType::f32, {kB, Tmax, kH, kD});
    cache.v = make_view(cv.data(), DType::f32, {kB, Tmax, kH, kDV});
    cache.lengths = make_view(lengths.data(), DType::i32, {kB});
    pathattn::ForwardOutputs out;
    out.o = make_view(o.data(), DType::f32, {kB, S, kH, kDV});
    out.lse = make_view(lse.data(), DType::f32, {kB, S, kH});
    pathattn::decode(in, cache, out);
  }
};

#ifdef PATHATTN_BENCH_TORCH
// The per-token libtorch step on [B, H, Tmax, D] tensors.
struct TorchStep {
  int64_t L, S;
  torch::Tensor K, V, q, k, v, w, beta;

  explicit TorchStep(const Step& s) : L(s.L), S(s.S) {
    auto t = [](const std::vector<float>& x, std::vector<int64_t> sizes) {
      return torch::from_blob(const_cast<float*>(x.data()), sizes, torch::kFloat32).clone();
    };
    K = t(s.ck, {kB, s.Tmax, kH, kD}).transpose(1, 2).contiguous();  // [B, H, Tmax, D]
    V = t(s.cv, {kB, s.Tmax, kH, kDV}).transpose(1, 2).contiguous();
    q = t(s.q, {kB, S, kH, kD}).transpose(1, 2).contiguous();  // [B, H, S, D]
    k = t(s.k, {kB, S, kH, kD}).transpose(1, 2).contiguous();
    v = t(s.v, {kB, S, kH, kDV}).transpose(1, 2).contiguous();
    w = t(s.w, {kB, S, kH, kD}).transpose(1, 2).contiguous();
    beta = t(s.beta, {kB, S, kH}).transpose(1, 2).contiguous().unsqueeze(-1);  // [B, H, S, 1]
  }

  void step() {
    torch::NoGradGuard ng;
    const double scale = 1.0 / std::sqrt(double(kD));
    for (int64_t i = 0; i < S; ++i) {
      const int64_t n = L + i;
      auto Kc = K.narrow(2, 0, n);                                   // [B, H, n, D]
      auto wi = w.narrow(2, i, 1), bi = beta.narrow(2, i, 1);        // [B, H, 1, D], [B, H, 1, 1]
      Kc.sub_(bi * torch::matmul(Kc, wi.transpose(-1, -2)) * wi);    // k <- k - beta (k . w) w   (docs/math.md Eq. 3)
      K.narrow(2, n, 1).copy_(k.narrow(2, i, 1));
      V.narrow(2, n, 1).copy_(v.narrow(2, i, 1));
      auto Ka = K.narrow(2, 0, n + 1), Va = V.narrow(2, 0, n + 1);
      auto p = torch::softmax(torch::matmul(q.narrow(2, i, 1), Ka.transpose(-1, -2)) * scale, -1);
      (void)torch::matmul(p, Va);
    }
  }
};
#endif

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, reps = 20;
  std::vector<int64_t> Ls = {256, 1024, 4096, 16384}, Ss = {1, 16};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--threads" && has) threads = std::stoi(argv[++i]);
    else if (a == "--reps" && has) reps = std::max(1, std::stoi(argv[++i]));
    else if (a == "--L" && has) Ls = parse_list(argv[++i]);
    else if (a == "--S" && has) Ss = parse_list(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_decode [--threads N] [--reps R] [--L 256,1024,...] [--S 1,16]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (threads > 0) pathattn::set_num_threads(threads);
  const int nthreads = threads > 0 ? threads : omp_get_max_threads();
#ifdef PATHATTN_BENCH_TORCH
  at::set_num_threads(nthreads);
#endif
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  std::printf("# bench_decode: B = %lld, H = HQ = %lld, D = DV = %lld, f32, %d threads, OMP_WAIT_POLICY=%s, median of %d\n",
              (long long)kB, (long long)kH, (long long)kD, nthreads, wait ? wait : "(unset)", reps);
  std::printf("%7s %4s %12s %10s %12s %10s %8s\n", "L", "S", "fused ms", "GB/s", "torch ms", "GB/s", "torch/fused");
  for (int64_t L : Ls)
    for (int64_t S : Ss) {
      Step s(L, S);
      const double bytes = double(3 * kD + kDV) * L * kH * 4;  // the floor of one pass (header comment)
#ifdef PATHATTN_BENCH_TORCH
      TorchStep ts(s);
      const std::vector<double> ms = pathattn::bench::interleaved_medians(reps, {[&] { s.fused(); }, [&] { ts.step(); }});
      std::printf("%7lld %4lld %12.3f %10.1f %12.3f %10.1f %8.2fx\n", (long long)L, (long long)S, ms[0],
                  bytes / ms[0] * 1e-6, ms[1], S * bytes / ms[1] * 1e-6, ms[1] / ms[0]);
#else
      const double ms = pathattn::bench::median_ms(reps, [&] { s.fused(); });
      std::printf("%7lld %4lld %12.3f %10.1f %12s %10s %8s\n", (long long)L, (long long)S, ms, bytes / ms * 1e-6, "-",
                  "-", "-");
#endif
      std::fflush(stdout);
    }
  return 0;
}
