// The library's environment switches (docs/cuda.md, "Environment"), parsed in one place. An unset or empty variable
// means the default; any other value must be one the variable takes, else the call fails with an Error that names
// the variable, the value and what it takes: a misspelt switch would otherwise run (and be measured as) the default.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

namespace pathattn::env {

// "0" (false) or "1" (true).
bool flag(const char* name, bool dflt);

// A whole decimal number in [lo, hi]; dflt when unset (dflt need not lie in the range: e.g. 0 for "not set" where
// a set value must be >= 1).
int64_t integer(const char* name, int64_t dflt, int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max());

// One of `words`; dflt when unset (dflt need not be among them: e.g. "" for "chosen by the dtype").
std::string choice(const char* name, std::initializer_list<const char*> words, const char* dflt);

}  // namespace pathattn::env
