// OpCount: how many ATen operators a piece of code runs, by name, counting only the leaves (operators that call no
// other operator while they run). On the GPU every leaf that does arithmetic is at least one kernel launch, so the
// count is what a launch-bound training step (the synthetic tasks' small models: docs/results/synthetic) pays per
// step; bench_step --ops prints it. Operators that only make views or metadata (view, transpose, empty, ...) are
// counted apart as "metadata": they launch nothing.
//
// It uses ATen's RecordFunction observers (the same hooks as the autograd profiler), registered for every thread
// while an OpCount lives, so the backward's operators (run on the autograd engine's threads) count too. One OpCount
// at a time; what a stopped one counted stays readable after the next one starts.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace pathattn::model {

class OpCount {
 public:
  OpCount();   // starts counting
  ~OpCount();  // stops (if stop() was not called)
  OpCount(const OpCount&) = delete;
  OpCount& operator=(const OpCount&) = delete;

  void stop();
  // Leaf operators that launch work, by name (e.g. "aten::mm"), and their total.
  std::map<std::string, int64_t> launching() const;
  int64_t launching_total() const;
  // Leaf operators that only make views or metadata (is_metadata_op).
  int64_t metadata_total() const;

 private:
  std::map<std::string, int64_t> leaves() const;  // every leaf so far (stop() keeps them)

  std::uint64_t handle_ = 0;
  bool active_ = false;
  std::map<std::string, int64_t> leaves_;
};

// Whether an operator's name is one that makes a view or reads metadata and launches no kernel.
bool is_metadata_op(const std::string& name);

}  // namespace pathattn::model
