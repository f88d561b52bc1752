#include "common/env.h"

#include <cerrno>
#include <cstdlib>

#include "pathattn/pathattn.h"

namespace pathattn::env {

namespace {
// The variable's value, or nullptr when it is unset or empty.
const char* value_of(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && *e != '\0' ? e : nullptr;
}
[[noreturn]] void refuse(const char* name, const char* value, const std::string& expected) {
  throw Error(std::string("pathattn: environment variable ") + name + "='" + value + "': expected " + expected +
              " (or unset for the default)");
}
}  // namespace

bool flag(const char* name, bool dflt) {
  const char* e = value_of(name);
  if (e == nullptr) return dflt;
  const std::string v = e;
  if (v == "0") return false;
  if (v == "1") return true;
  refuse(name, e, "0 or 1");
}

int64_t integer(const char* name, int64_t dflt, int64_t lo, int64_t hi) {
  const char* e = value_of(name);
  if (e == nullptr) return dflt;
  const std::string range = "a whole number in [" + std::to_string(lo) + ", " +
                            (hi == std::numeric_limits<int64_t>::max() ? std::string("...") : std::to_string(hi)) + "]";
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(e, &end, 10);
  if (end == e || *end != '\0' || errno == ERANGE || v < lo || v > hi) refuse(name, e, range);
  return static_cast<int64_t>(v);
}

std::string choice(const char* name, std::initializer_list<const char*> words, const char* dflt) {
  const char* e = value_of(name);
  if (e == nullptr) return dflt;
  std::string list;
  for (const char* w : words) {
    if (std::string(e) == w) return e;
    list += (list.empty() ? "" : ", ") + std::string(w);
  }
  refuse(name, e, "one of " + list);
}

}  // namespace pathattn::env
