#include "op_count.h"

#include <ATen/record_function.h>

#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

namespace pathattn::model {

namespace {

// The counts of the one live OpCount (observers are plain function pointers, so the state is global).
std::mutex g_mutex;
std::map<std::string, int64_t> g_leaves;
bool g_live = false;

// Per thread, the operators that have started and not ended, each with whether another operator started inside it.
thread_local std::vector<bool> t_has_child;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  // A view or metadata operator inside another does not make it a non-leaf: CPU matmuls call resolve_conj, a
  // no-op for real tensors, and are still the one operator that does the work.
  if (!t_has_child.empty() && !is_metadata_op(fn.name())) t_has_child.back() = true;
  t_has_child.push_back(false);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_has_child.empty()) return;  // started before the counting did
  const bool had_child = t_has_child.back();
  t_has_child.pop_back();
  if (had_child) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_leaves[fn.name()];
}

}  // namespace

bool is_metadata_op(const std::string& name) {
  // The autograd engine's per-node records: what a node does is counted by the operators it runs.
  if (name.rfind("autograd::", 0) == 0) return true;
  static const std::set<std::string> kViews = {
      "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::empty", "aten::empty_strided",
      "aten::t", "aten::transpose", "aten::permute", "aten::expand", "aten::unsqueeze", "aten::squeeze",
      "aten::select", "aten::slice", "aten::narrow", "aten::detach", "aten::alias", "aten::split", "aten::chunk",
      "aten::unbind", "aten::resize_", "aten::set_", "aten::lift_fresh", "aten::result_type", "aten::numpy_T",
      "aten::_unsafe_view", "aten::view_as", "aten::expand_as", "aten::unflatten", "aten::flatten", "aten::movedim",
      "aten::split_with_sizes", "aten::contiguous", "aten::is_same_size", "aten::_has_compatible_shallow_copy_type",
      "aten::size", "aten::stride", "aten::dim", "aten::is_complex", "aten::is_floating_point", "aten::empty_like",
      "aten::resolve_conj", "aten::resolve_neg", "aten::_conj", "aten::conj", "aten::detach_", "detach_", "detach",
      // to() that converts calls _to_copy (the leaf that launches); a to() with no operator inside returned self
      "aten::to"};
  return kViews.count(name) != 0;
}

OpCount::OpCount() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_live) throw std::logic_error("OpCount: one at a time");
    g_live = true;
    g_leaves.clear();
  }
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_start, &on_end).scopes({at::RecordScope::FUNCTION}));
  active_ = true;
}

OpCount::~OpCount() { stop(); }

void OpCount::stop() {
  if (!active_) return;
  at::removeCallback(handle_);
  active_ = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  leaves_ = g_leaves;
  g_live = false;
}

std::map<std::string, int64_t> OpCount::leaves() const {
  if (!active_) return leaves_;
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_leaves;
}

std::map<std::string, int64_t> OpCount::launching() const {
  std::map<std::string, int64_t> out;
  for (const auto& [name, n] : leaves())
    if (!is_metadata_op(name)) out[name] = n;
  return out;
}

int64_t OpCount::launching_total() const {
  int64_t total = 0;
  for (const auto& [name, n] : launching()) total += n;
  return total;
}

int64_t OpCount::metadata_total() const {
  int64_t total = 0;
  for (const auto& [name, n] : leaves())
    if (is_metadata_op(name)) total += n;
  return total;
}

}  // namespace pathattn::model
