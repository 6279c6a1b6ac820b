// core/env.h: the TERN_* knobs' reading rules (issue #17): defaults when unset or empty, the accepted values,
// and a refusal naming the variable, the value and what is accepted for anything else.
#include "core/env.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/error.h"
#include "refusal.h"

namespace tern {
namespace {

constexpr const char* kVar = "TERN_TEST_ENV_KNOB";

// Sets kVar for one test (nullptr: unset) and unsets it after.
class Env : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv(kVar); }
  void TearDown() override { unsetenv(kVar); }
  static void set(const char* value) { setenv(kVar, value, 1); }
};

using test::refusal;

TEST_F(Env, StringUnsetEmptyAndSet) {
  EXPECT_EQ(env_string(kVar), std::nullopt);
  set("");
  EXPECT_EQ(env_string(kVar), std::nullopt);
  set("/some/path with spaces");
  EXPECT_EQ(env_string(kVar), std::optional<std::string>("/some/path with spaces"));
}

TEST_F(Env, FlagDefaultsWhenUnsetOrEmpty) {
  EXPECT_TRUE(env_flag(kVar, true));
  EXPECT_FALSE(env_flag(kVar, false));
  set("");
  EXPECT_TRUE(env_flag(kVar, true));
  EXPECT_FALSE(env_flag(kVar, false));
}

TEST_F(Env, FlagAcceptsTheSixSpellingsInAnyCase) {
  for (const char* on : {"1", "on", "true", "ON", "True"}) {
    set(on);
    EXPECT_TRUE(env_flag(kVar, false)) << on;
  }
  for (const char* off : {"0", "off", "false", "OFF", "False"}) {
    set(off);
    EXPECT_FALSE(env_flag(kVar, true)) << off;
  }
}

TEST_F(Env, FlagRefusesAnythingElse) {
  for (const char* junk : {"2", "yes", "of", " 1", "1 ", "enabled"}) {
    set(junk);
    EXPECT_THROW(env_flag(kVar, true), Error) << junk;
  }
  set("maybe");
  EXPECT_EQ(refusal([] { env_flag(kVar, true); }),
            "TERN_TEST_ENV_KNOB=\"maybe\": expected 1, on, true or 0, off, false (unset: on)");
  EXPECT_EQ(refusal([] { env_flag(kVar, false); }),
            "TERN_TEST_ENV_KNOB=\"maybe\": expected 1, on, true or 0, off, false (unset: off)");
}

TEST_F(Env, IntDefaultsWhenUnsetOrEmpty) {
  EXPECT_EQ(env_int(kVar, 9, 1, 100), 9);
  EXPECT_EQ(env_int(kVar, 0, 1, 4), 0);  // a default outside the range ("the rule decides") is returned as it is
  set("");
  EXPECT_EQ(env_int(kVar, 9, 1, 100), 9);
}

TEST_F(Env, IntAcceptsTheRangeInclusive) {
  set("1");
  EXPECT_EQ(env_int(kVar, 9, 1, 100), 1);
  set("100");
  EXPECT_EQ(env_int(kVar, 9, 1, 100), 100);
  set("-3");
  EXPECT_EQ(env_int(kVar, 0, -5, 5), -3);
  set("9223372036854775807");
  EXPECT_EQ(env_int(kVar, 0, 0, INT64_MAX), INT64_MAX);
}

TEST_F(Env, IntRefusesJunkAndOutOfRange) {
  for (const char* junk : {"abc", "12abc", "1.5", " 3", "3 ", "+3", "0x10", "-"}) {
    set(junk);
    EXPECT_THROW(env_int(kVar, 9, -100, 100), Error) << junk;
  }
  set("12abc");
  EXPECT_EQ(refusal([] { env_int(kVar, 9, 1, 100); }),
            "TERN_TEST_ENV_KNOB=\"12abc\": not an integer, expected an integer from 1 to 100 (unset: 9)");
  set("0");
  EXPECT_EQ(refusal([] { env_int(kVar, 9, 1, 100); }),
            "TERN_TEST_ENV_KNOB=\"0\": out of range, expected an integer from 1 to 100 (unset: 9)");
  set("101");
  EXPECT_THROW(env_int(kVar, 9, 1, 100), Error);
  set("99999999999999999999");  // past int64_t
  EXPECT_EQ(refusal([] { env_int(kVar, 3, 0, 3); }),
            "TERN_TEST_ENV_KNOB=\"99999999999999999999\": out of range, expected an integer from 0 to 3 (unset: 3)");
}

TEST_F(Env, ChoiceDefaultsWhenUnsetOrEmpty) {
  EXPECT_EQ(env_choice(kVar, {"auto", "tc", "cuda-cores"}, "auto"), "auto");
  set("");
  EXPECT_EQ(env_choice(kVar, {"auto", "tc", "cuda-cores"}, "auto"), "auto");
}

TEST_F(Env, ChoiceReturnsTheValueAsked) {
  for (const char* v : {"auto", "tc", "cuda-cores"}) {
    set(v);
    EXPECT_EQ(env_choice(kVar, {"auto", "tc", "cuda-cores"}, "auto"), v);
  }
}

TEST_F(Env, ChoiceRefusesAnythingElseListingTheAllowed) {
  for (const char* junk : {"TC", "tc ", "cuda_cores", "librar"}) {
    set(junk);
    EXPECT_THROW(env_choice(kVar, {"auto", "tc", "cuda-cores"}, "auto"), Error) << junk;
  }
  set("librar");
  EXPECT_EQ(refusal([] { env_choice(kVar, {"grouped", "library"}, "grouped"); }),
            "TERN_TEST_ENV_KNOB=\"librar\": expected grouped or library (unset: grouped)");
  EXPECT_EQ(refusal([] { env_choice(kVar, {"default", "old", "128x128", "small-unswapped"}, "default"); }),
            "TERN_TEST_ENV_KNOB=\"librar\": expected default, old, 128x128 or small-unswapped (unset: default)");
  EXPECT_EQ(refusal([] { env_choice(kVar, {"only"}, "only"); }),
            "TERN_TEST_ENV_KNOB=\"librar\": expected only (unset: only)");
}

// A knob read per call sees each new value (the helpers cache nothing).
TEST_F(Env, ReadAtEachCall) {
  set("4");
  EXPECT_EQ(env_int(kVar, 0, 0, 8), 4);
  set("8");
  EXPECT_EQ(env_int(kVar, 0, 0, 8), 8);
  unsetenv(kVar);
  EXPECT_EQ(env_int(kVar, 0, 0, 8), 0);
}

}  // namespace
}  // namespace tern
