#include "loongforge/env_knobs.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "loongforge/memory.h"

namespace loongforge {
namespace {

// Sets `name` to `value` for the scope (nullptr: unset), restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// A name no knob has, spelled in two literals so that tests/python/test_knobs.py's scan for
// undeclared knobs does not take it for one.
constexpr const char* kUndeclared =
    "LOONGFORGE_"
    "NOT_DECLARED";

TEST(EnvKnobs, TableIsWellFormed) {
  size_t n = 0;
  const EnvKnob* t = EnvKnobTable(&n);
  ASSERT_GT(n, 0u);
  std::set<std::string> names;
  for (size_t i = 0; i < n; ++i) {
    const EnvKnob& k = t[i];
    std::string name = k.name;
    EXPECT_EQ(name.rfind("LOONGFORGE_", 0), 0u) << name;
    EXPECT_TRUE(names.insert(name).second) << name << " declared twice";
    EXPECT_GT(std::string(k.doc).size(), 10u) << name;
    EXPECT_EQ(std::string(k.doc).find('\n'), std::string::npos) << name;
    EXPECT_EQ(FindEnvKnob(name), &k);
    // The default parses as the declared type: unset, the getter gives it without an error.
    ScopedEnv unset(k.name, nullptr);
    EXPECT_TRUE(CheckEnvKnob(k.name).ok()) << name << " default '" << k.default_value << "'";
  }
  EXPECT_EQ(FindEnvKnob(kUndeclared), nullptr);
}

TEST(EnvKnobs, IntUnsetEmptyAndValid) {
  {
    ScopedEnv e("LOONGFORGE_MEM_SEGMENT_MB", nullptr);
    EXPECT_EQ(*ParseEnvInt("LOONGFORGE_MEM_SEGMENT_MB"), 32);
    EXPECT_EQ(EnvInt("LOONGFORGE_MEM_SEGMENT_MB"), 32);
  }
  {
    ScopedEnv e("LOONGFORGE_MEM_SEGMENT_MB", "");
    EXPECT_EQ(*ParseEnvInt("LOONGFORGE_MEM_SEGMENT_MB"), 32);
  }
  {
    ScopedEnv e("LOONGFORGE_MEM_SEGMENT_MB", "128");
    EXPECT_EQ(*ParseEnvInt("LOONGFORGE_MEM_SEGMENT_MB"), 128);
    EXPECT_EQ(EnvInt("LOONGFORGE_MEM_SEGMENT_MB"), 128);
  }
}

TEST(EnvKnobs, BadIntNamesTheVariableAndTheValue) {
  for (const char* bad : {"12x", "abc", " 9", "0x10", "1.5", "-", "99999999999999999999999"}) {
    ScopedEnv e("LOONGFORGE_MEM_LIMIT_MB", bad);
    StatusOr<int64_t> v = ParseEnvInt("LOONGFORGE_MEM_LIMIT_MB");
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("LOONGFORGE_MEM_LIMIT_MB='" + std::string(bad) + "'"),
              std::string::npos)
        << v.status().message();
  }
  // Below the knob's minimum (a negative cap), and past the MiB that fit 64 bits of bytes.
  for (const char* out : {"-1", "9223372036854775807"}) {
    ScopedEnv e("LOONGFORGE_MEM_LIMIT_MB", out);
    StatusOr<int64_t> v = ParseEnvInt("LOONGFORGE_MEM_LIMIT_MB");
    ASSERT_FALSE(v.ok()) << out;
    EXPECT_NE(v.status().message().find("must be in [0, "), std::string::npos)
        << v.status().message();
  }
}

TEST(EnvKnobs, BadValueWithoutErrorPathWarnsAndGivesTheDefault) {
  ScopedEnv e("LOONGFORGE_MEM_SEGMENT_MB", "lots");
  testing::internal::CaptureStderr();
  EXPECT_EQ(EnvInt("LOONGFORGE_MEM_SEGMENT_MB"), 32);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("LOONGFORGE_MEM_SEGMENT_MB='lots'"), std::string::npos) << err;
  EXPECT_NE(err.find("default"), std::string::npos) << err;
}

TEST(EnvKnobs, Bool) {
  for (const char* t : {"1", "true", "TRUE", "yes", "on"}) {
    ScopedEnv e("LOONGFORGE_CUDA_SYNC", t);
    EXPECT_TRUE(*ParseEnvBool("LOONGFORGE_CUDA_SYNC")) << t;
  }
  for (const char* f : {"0", "false", "No", "off"}) {
    ScopedEnv e("LOONGFORGE_MEM_PLAN_UNSEEN", f);
    EXPECT_FALSE(*ParseEnvBool("LOONGFORGE_MEM_PLAN_UNSEEN")) << f;
  }
  {
    ScopedEnv e("LOONGFORGE_MEM_PLAN_UNSEEN", nullptr);
    EXPECT_TRUE(EnvBool("LOONGFORGE_MEM_PLAN_UNSEEN"));
  }
  ScopedEnv e("LOONGFORGE_CUDA_SYNC", "2");
  StatusOr<bool> v = ParseEnvBool("LOONGFORGE_CUDA_SYNC");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("LOONGFORGE_CUDA_SYNC='2'"), std::string::npos);
}

TEST(EnvKnobs, FloatAndStringChoices) {
  {
    ScopedEnv e("LOONGFORGE_SIGNAL_GRACE_S", "0.5");
    EXPECT_DOUBLE_EQ(*ParseEnvFloat("LOONGFORGE_SIGNAL_GRACE_S"), 0.5);
  }
  for (const char* bad : {"inf", "nan", "1s", " 1"}) {
    ScopedEnv e("LOONGFORGE_SIGNAL_GRACE_S", bad);
    EXPECT_FALSE(ParseEnvFloat("LOONGFORGE_SIGNAL_GRACE_S").ok()) << bad;
  }
  {
    ScopedEnv e("LOONGFORGE_LOG_LEVEL", "debug");
    EXPECT_EQ(*ParseEnvString("LOONGFORGE_LOG_LEVEL"), "DEBUG");  // the declared spelling
  }
  {
    ScopedEnv e("LOONGFORGE_LOG_LEVEL", "LOUD");
    StatusOr<std::string> v = ParseEnvString("LOONGFORGE_LOG_LEVEL");
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("LOONGFORGE_LOG_LEVEL='LOUD'"), std::string::npos);
    EXPECT_NE(v.status().message().find("DEBUG|INFO"), std::string::npos);
  }
  {
    ScopedEnv e("LOONGFORGE_MEM_TRACE", "/tmp/any thing");
    EXPECT_EQ(EnvString("LOONGFORGE_MEM_TRACE"), "/tmp/any thing");
  }
}

// The allocator's declared default is the allocator's own: unset, the knob changes nothing.
TEST(EnvKnobs, MaxPlansDefaultIsTheAllocatorsDefault) {
  ScopedEnv e("LOONGFORGE_MEM_MAX_PLANS", nullptr);
  EXPECT_EQ(static_cast<size_t>(EnvInt("LOONGFORGE_MEM_MAX_PLANS")),
            mem::MemAllocator::Options().max_plans);
}

TEST(EnvKnobsDeathTest, UndeclaredOrMistypedReadAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(EnvInt(kUndeclared), "LOONGFORGE_NOT_DECLARED is not declared");
  EXPECT_DEATH(ParseEnvString(kUndeclared).ok(), "not declared");
  EXPECT_DEATH(EnvBool("LOONGFORGE_MEM_LIMIT_MB"), "LOONGFORGE_MEM_LIMIT_MB is declared int");
}

}  // namespace
}  // namespace loongforge
