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

}  // namespace pathattn
