// Tests of `loongforge mem plan|replay TRACE` through the real CLI binary (LF_TEST_CLI): exit
// codes, one-line errors, and JSON figures checked against the library's own planner.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loongforge/memory.h"
#include "test_cli.h"

namespace loongforge {
namespace mem {
namespace {

namespace fs = std::filesystem;

using testing::CliResult;
using testing::RunCli;

Trace MakeTrace();

// The JSON that the command printed; null, with a test failure, when it failed.
nlohmann::json JsonOf(const CliResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json();
}

class MemCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lf_memcli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // MakeTrace() written as text; its path.
  std::string WriteTrace() { return Write("t.trace", MakeTrace().ToText()); }
  fs::path dir_;
};

// Three steps: "a" twice (a 1 MiB + 2 MiB pair that overlaps, then a 3 MiB one alone: lower bound
// 3 MiB), then "b" once (two disjoint 1 MiB lifetimes: lower bound 1 MiB).
Trace MakeTrace() {
  const int64_t kMiB = 1 << 20;
  Trace t;
  uint64_t id = 1;
  for (int step = 0; step < 2; ++step) {
    t.MarkStep("a", 0);
    uint64_t x = id++, y = id++, z = id++;
    t.AddAlloc(x, kMiB, 0, 0);
    t.AddAlloc(y, 2 * kMiB, 0, 0);
    t.AddFree(x, 0, 0);
    t.AddFree(y, 0, 0);
    t.AddAlloc(z, 3 * kMiB, 0, 0);
    t.AddFree(z, 0, 0);
  }
  t.MarkStep("b", 0);
  uint64_t u = id++, v = id++;
  t.AddAlloc(u, kMiB, 0, 0);
  t.AddFree(u, 0, 0);
  t.AddAlloc(v, kMiB, 0, 0);
  t.AddFree(v, 0, 0);
  return t;
}

// Guards `mem plan --json`: one entry per step with the planner's own figures (peak reaches the
// lower bound on these simple steps) and the largest step's summary.
TEST_F(MemCli, PlanJson) {
  auto j = JsonOf(RunCli("mem plan " + WriteTrace() + " --json"));
  ASSERT_EQ(j["steps"].size(), 3u);
  EXPECT_EQ(j["steps"][0]["signature"], "a");
  EXPECT_EQ(j["steps"][2]["signature"], "b");
  EXPECT_EQ(j["steps"][0]["lower_bound_bytes"], 3 << 20);
  EXPECT_EQ(j["steps"][0]["peak_bytes"], 3 << 20);
  EXPECT_EQ(j["steps"][2]["lower_bound_bytes"], 1 << 20);
  EXPECT_EQ(j["steps"][2]["allocations"], 2);
  EXPECT_EQ(j["lower_bound_bytes"], 3 << 20);
  EXPECT_DOUBLE_EQ(j["overhead"].get<double>(), 0.0);
  std::string alg = j["steps"][0]["algorithm"];
  EXPECT_TRUE(alg == "greedy_by_size" || alg == "greedy_by_breadth") << alg;
}

// Guards the table form of `mem plan`: it names the algorithm and the overhead per step.
TEST_F(MemCli, PlanTable) {
  CliResult r = RunCli("mem plan " + WriteTrace());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("greedy_by_"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lower bound 3.0 MiB, peak 3.0 MiB, overhead 0.00%"), std::string::npos)
      << r.output;
}

// Guards `mem replay --json`: the three modes side by side, with the hits each must have: none
// from the pool, every planned allocation when planned from the whole trace, and all but each
// signature's first step on first sight.
TEST_F(MemCli, ReplayModes) {
  std::string path = WriteTrace();
  auto j = JsonOf(RunCli("mem replay " + path + " --json --segment-mb 4"));
  ASSERT_EQ(j["results"].size(), 4u);
  std::map<std::string, nlohmann::json> by;
  for (const auto& e : j["results"]) by[e["mode"]] = e;
  EXPECT_EQ(by["pool"]["planned_hits"], 0);
  EXPECT_EQ(by["planned"]["planned_hits"], 8);      // 3 + 3 + 2
  EXPECT_EQ(by["first_sight"]["planned_hits"], 3);  // a's second step
  EXPECT_EQ(by["first_sight"]["first_sight_plans"], 2);
  EXPECT_EQ(by["planned"]["peak_allocated_bytes"], 3 << 20);
  for (const auto& [m, e] : by) EXPECT_EQ(e["num_allocs"], 8) << m;
  // The baseline row: torch's caching allocator model sees the same live bytes, plans nothing.
  EXPECT_EQ(by["caching"]["planned_hits"], 0);
  EXPECT_EQ(by["caching"]["peak_allocated_bytes"], 3 << 20);
  EXPECT_GE(by["caching"]["peak_reserved_bytes"], by["caching"]["peak_allocated_bytes"]);
  EXPECT_EQ(by["caching"]["alloc_latency_ns"]["count"], 8);
  // One mode only.
  EXPECT_EQ(JsonOf(RunCli("mem replay " + path + " --json --mode pool"))["results"].size(), 1u);
}

// Guards zstd-compressed traces (bench/traces/*.trace.zst): the CLI reads them like plain text,
// and a truncated frame is an error naming the file.
TEST_F(MemCli, ReadsZstdTraces) {
  Trace t = MakeTrace();
  std::string plain = Write("t.trace", t.ToText());
  std::string zst = (dir_ / "t.trace.zst").string();
  ASSERT_TRUE(t.Save(zst, /*compress=*/true).ok());
  CliResult a = RunCli("mem plan " + plain + " --json");
  CliResult b = RunCli("mem plan " + zst + " --json");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto ja = nlohmann::json::parse(a.output), jb = nlohmann::json::parse(b.output);
  EXPECT_EQ(ja["steps"], jb["steps"]);
  EXPECT_EQ(ja["events"], jb["events"]);
  // Truncate the compressed file: the error names it.
  std::string bytes;
  {
    std::ifstream in(zst, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string cut = Write("cut.trace.zst", bytes.substr(0, bytes.size() / 2));
  CliResult c = RunCli("mem replay " + cut);
  EXPECT_NE(c.exit_code, 0);
  EXPECT_NE(c.output.find("cut.trace.zst"), std::string::npos) << c.output;
}

// Guards the CLI's error edge: exit code by Status code and one line naming the file or line.
TEST_F(MemCli, ErrorsNameTheInput) {
  std::string missing = (dir_ / "nope.trace").string();
  CliResult r = RunCli("mem plan " + missing);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("loongforge mem plan: error: NotFound: " + missing), std::string::npos)
      << r.output;
  std::string bad = Write("bad.trace", "s 0 a\na 1 1024 0 0\nx what\n");
  r = RunCli("mem replay " + bad);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("trace line 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
  std::string good = WriteTrace();
  r = RunCli("mem replay " + good + " --mode fastest");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("fastest"), std::string::npos) << r.output;
  r = RunCli("mem frobnicate " + good);
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
}  // namespace mem
}  // namespace loongforge
