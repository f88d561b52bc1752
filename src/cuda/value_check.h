// The CUDA backend's optional value check (Inputs::check_values, or PATHATTN_CHECK_VALUES=1 in the environment):
// beta in [0, 2] and g a finite log forget gate <= 0, neither NaN, as the CPU path always checks (docs/api.md).
// Off by default on CUDA: it reads the values back to the host, which synchronises the stream.
#pragma once

#include <cuda_runtime.h>

#include "common/problem.h"

namespace pathattn::cuda {

// Whether this call checks values: in.check_values, or PATHATTN_CHECK_VALUES set to anything but "" or "0".
bool checks_values(const Inputs& in);

// Throws pathattn::Error naming the first bad element (the same message as the CPU check) if beta or g (when
// present) holds a value out of range or NaN. One scan kernel and a 16-byte read back on `stream`.
void check_values(const Inputs& in, const Problem& p, cudaStream_t stream);

}  // namespace pathattn::cuda
