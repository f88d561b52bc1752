// The argument checks every entry point shares (src/common/problem.cpp): each throws pathattn::Error whose message
// names the argument and what was expected.
#pragma once

#include <initializer_list>
#include <string>

#include "pathattn/pathattn.h"

namespace pathattn {

[[noreturn]] void fail(const std::string& msg);  // throws Error("pathattn: " + msg)
std::string shape_str(const TensorView& t);
std::string shape_str(std::initializer_list<int64_t> sizes);
std::string device_str(Device d, int index);
// t's shape must be `sizes`; `layout` names the dimensions in the message, e.g. "[B, T, H, D]".
void check_shape(const TensorView& t, const char* name, const char* layout, std::initializer_list<int64_t> sizes);
// t must be on q's device; `q_name` names the reference argument in the message.
void check_same_device(const TensorView& t, const char* name, const TensorView& q, const char* q_name = "q");
void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed);
void check_pointer(const TensorView& t, const char* name);
// An output (written) or a backward input: defined, of shape `sizes`, dtype, on (device, device_index), which the
// message names as the device of `device_of`; a written one must not be a broadcast view.
void check_view(const TensorView& t, const char* name, std::initializer_list<int64_t> sizes, DType dtype, Device device,
                int device_index, const char* device_of, bool written);
// Host values of cu_seqlens (n + 1 entries, `stride` apart): 0 first, non-decreasing, T last (`T_of` says where T
// comes from in the message, e.g. " (u.size(1))").
void check_cu_seqlens(const int32_t* c, int64_t n, int64_t stride, int64_t T, const char* T_of);

}  // namespace pathattn
