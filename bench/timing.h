// Timing helpers of the CPU benchmarks: wall-clock medians after a warm-up, and interleaved medians so that a
// shared machine's load falls on every compared function alike.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace pathattn::bench {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median time of f over reps runs after one warm-up run; a warm-up above 5 s means one timed run is enough.
inline double median_ms(int reps, const std::function<void()>& f) {
  double t0 = now_ms();
  f();
  const double warm = now_ms() - t0;
  if (warm > 5000) reps = 1;
  std::vector<double> ts;
  for (int r = 0; r < reps; ++r) {
    t0 = now_ms();
    f();
    ts.push_back(now_ms() - t0);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// Medians of several functions timed in turn (a, b, c, a, b, c, ...) after one warm-up each: on a shared
// machine the load then falls on all of them alike, so their ratios stay meaningful.
inline std::vector<double> interleaved_medians(int reps, const std::vector<std::function<void()>>& fs) {
  double warm = 0;
  for (const auto& f : fs) {
    const double t0 = now_ms();
    f();
    warm = std::max(warm, now_ms() - t0);
  }
  if (warm > 5000) reps = 1;
  std::vector<std::vector<double>> ts(fs.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < fs.size(); ++i) {
      const double t0 = now_ms();
      fs[i]();
      ts[i].push_back(now_ms() - t0);
    }
  std::vector<double> med;
  for (auto& t : ts) {
    std::sort(t.begin(), t.end());
    med.push_back(t[t.size() / 2]);
  }
  return med;
}

}  // namespace pathattn::bench
