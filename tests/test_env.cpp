// common/env.h: the environment switches' parsing. Unset or empty gives the default; a value the switch does not take
// is an Error naming the variable and the value (never a silent default: a misspelt switch would be measured as one).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/env.h"
#include "pathattn/pathattn.h"

namespace pathattn::test {
namespace {

constexpr const char* kVar = "PATHATTN_TEST_ENV_SWITCH";

// Sets kVar for one test (nullptr: unset) and unsets it afterwards.
struct EnvValue {
  explicit EnvValue(const char* v) {
    if (v) setenv(kVar, v, 1);
    else unsetenv(kVar);
  }
  ~EnvValue() { unsetenv(kVar); }
};

// The message of the Error that f throws, or "" when it throws none.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Env, FlagTakesZeroOrOne) {
  { EnvValue v(nullptr); EXPECT_TRUE(env::flag(kVar, true)); EXPECT_FALSE(env::flag(kVar, false)); }
  { EnvValue v(""); EXPECT_TRUE(env::flag(kVar, true)); }
  { EnvValue v("0"); EXPECT_FALSE(env::flag(kVar, true)); }
  { EnvValue v("1"); EXPECT_TRUE(env::flag(kVar, false)); }
  for (const char* bad : {"yes", "2", "01", " 1", "true"}) {
    EnvValue v(bad);
    const std::string msg = error_of([] { env::flag(kVar, false); });
    EXPECT_NE(msg.find(kVar), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("0 or 1"), std::string::npos) << msg;
  }
}

TEST(Env, IntegerInItsRange) {
  { EnvValue v(nullptr); EXPECT_EQ(env::integer(kVar, 0, 1), 0); }  // the default may lie outside the range
  { EnvValue v("17"); EXPECT_EQ(env::integer(kVar, 0, 1), 17); }
  { EnvValue v("511"); EXPECT_EQ(env::integer(kVar, 0, 0, 511), 511); }
  { EnvValue v("0"); EXPECT_EQ(env::integer(kVar, 5, 0), 0); }
  for (const char* bad : {"0", "-3", "12x", "x", "1.5", "99999999999999999999"}) {
    EnvValue v(bad);
    const std::string msg = error_of([] { env::integer(kVar, 4, 1, 1000); });
    EXPECT_NE(msg.find(kVar), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("[1, 1000]"), std::string::npos) << msg;
  }
  { EnvValue v("512"); EXPECT_NE(error_of([] { env::integer(kVar, 0, 0, 511); }), ""); }
}

TEST(Env, ChoiceAmongItsWords) {
  { EnvValue v(nullptr); EXPECT_EQ(env::choice(kVar, {"mma", "twoe"}, "onee"), "onee"); }
  { EnvValue v(""); EXPECT_EQ(env::choice(kVar, {"mma"}, ""), ""); }
  { EnvValue v("twoe"); EXPECT_EQ(env::choice(kVar, {"mma", "twoe"}, "onee"), "twoe"); }
  EnvValue v("wdie");
  const std::string msg = error_of([] { env::choice(kVar, {"wgmma", "mma"}, "wgmma"); });
  EXPECT_NE(msg.find("'wdie'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("one of wgmma, mma"), std::string::npos) << msg;
}

}  // namespace
}  // namespace pathattn::test
