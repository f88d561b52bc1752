// optim_step.h.
#include "optim_step.h"

#include <torch/version.h>

#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace pathattn::model {

namespace {

// The key torch::optim keeps a parameter's state under: its TensorImpl's address, as a string in libtorch 1.x
// (c10::guts::to_string, an ostringstream of the pointer) and as the pointer itself in 2.x.
template <typename Map>
typename Map::key_type state_key(const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// The tensors of one foreach update: parameters that share a step count (the bias corrections depend on it).
struct StepLists {
  std::vector<torch::Tensor> p, g, m, v;
};

}  // namespace

void adamw_step_foreach(torch::optim::AdamW& opt) {
  using torch::optim::AdamWOptions;
  using torch::optim::AdamWParamState;
  torch::NoGradGuard no_grad;
  auto& state = opt.state();
  using Map = std::remove_reference_t<decltype(state)>;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const AdamWOptions&>(group.options());
    if (o.amsgrad()) throw std::invalid_argument("adamw_step_foreach: amsgrad is not supported");
    std::map<int64_t, StepLists> by_step;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw std::invalid_argument("adamw_step_foreach: sparse gradients are not supported");
      const auto key = state_key<Map>(p);
      auto it = state.find(key);
      if (it == state.end()) {  // as torch::optim::AdamW initialises it
        auto s = std::make_unique<AdamWParamState>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state.emplace(key, std::move(s)).first;
      }
      auto& s = static_cast<AdamWParamState&>(*it->second);
      s.step(s.step() + 1);
      StepLists& l = by_step[s.step()];
      l.p.push_back(p);
      l.g.push_back(p.grad());
      l.m.push_back(s.exp_avg());
      l.v.push_back(s.exp_avg_sq());
    }
    const double lr = o.lr(), wd = o.weight_decay(), eps = o.eps();
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (auto& [step, l] : by_step) {
      const double bc1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double bc2 = 1 - std::pow(beta2, static_cast<double>(step));
      if (wd != 0) at::_foreach_mul_(l.p, 1 - lr * wd);
      at::_foreach_mul_(l.m, beta1);
      at::_foreach_add_(l.m, l.g, 1 - beta1);
      at::_foreach_mul_(l.v, beta2);
      at::_foreach_addcmul_(l.v, l.g, l.g, 1 - beta2);
      std::vector<torch::Tensor> denom = at::_foreach_sqrt(l.v);
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, eps);
      at::_foreach_addcdiv_(l.p, l.m, denom, -lr / bc1);
    }
  }
}

void clip_grad_norm_no_sync(const std::vector<torch::Tensor>& params, double max_norm, bool foreach) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads, norms;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  if (foreach) {
    norms = at::_foreach_norm(grads, 2);
  } else {
    for (const auto& g : grads) norms.push_back(g.norm(2));
  }
  const torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
  const torch::Tensor coef = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (foreach) {
    at::_foreach_mul_(grads, coef);
    return;
  }
#endif
  for (auto& g : grads) g.mul_(coef);
}

}  // namespace pathattn::model
