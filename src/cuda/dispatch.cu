// The one place where runtime values (dtype, head dimension, gate, key cache) become template arguments.
#include "cuda/dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/launch/launch.h"

namespace pathattn::cuda {
namespace {

template <typename T, int D>
void run_typed(const Params& p, bool gate, bool kcache, cudaStream_t stream) {
  if (gate) launch_gate(p, stream);
  launch_prep<T, D>(p, stream);
  if (gate)
    launch_fwd<T, D, true>(p, stream);
  else
    launch_fwd<T, D, false>(p, stream);
  if (kcache) launch_kcache<T, D>(p, stream);
}

template <typename T>
void run_dim(const Params& p, int D, bool gate, bool kcache, cudaStream_t stream) {
  if (D == 64)
    run_typed<T, 64>(p, gate, kcache, stream);
  else
    run_typed<T, 128>(p, gate, kcache, stream);
}

}  // namespace

void run_forward(const Params& p, DType dtype, int D, bool gate, bool kcache, cudaStream_t stream) {
  if (dtype == DType::bf16)
    run_dim<__nv_bfloat16>(p, D, gate, kcache, stream);
  else
    run_dim<__half>(p, D, gate, kcache, stream);
}

}  // namespace pathattn::cuda
