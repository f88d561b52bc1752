// PaTH attention from C++ (libtorch): built with the project as example_cpp; run ./build/torch/example_cpp.
#include <torch/torch.h>

#include "torch/pathattn_torch.h"

int main() {
  const int64_t B = 2, T = 64, H = 4, D = 32;  // q, k, v, w: [B, T, H, D]; beta: [B, T, H] in [0, 2]
  auto q = torch::randn({B, T, H, D}, torch::requires_grad()), k = torch::randn({B, T, H, D}), v = torch::randn({B, T, H, D});
  auto w = torch::randn({B, T, H, D}), beta = 2 * torch::rand({B, T, H});
  w = w / w.norm(2, -1, true);                           // unit-norm directions
  auto o = pathattn::path_attention(q, k, v, w, beta);  // [B, T, H, D]; optional g, scale, cu_seqlens follow
  o.sum().backward();
  std::cout << "o " << o.sizes() << ", |dq| = " << q.grad().norm().item<double>() << "\n";
}
