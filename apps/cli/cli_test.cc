// Tests of the `loongforge` CLI's argument handling through the real binary (LF_TEST_CLI): --help
// per (sub)command, usage errors as exit code 2 with one line, and flags that reach the library.
// Each command's own behaviour is tested beside its module (PackCli, CkptCli, MemCli).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "loongforge/env_knobs.h"
#include "test_cli.h"

namespace loongforge {
namespace {

namespace fs = std::filesystem;

using testing::CliResult;
using testing::RunCli;

// Guards `--help` at every level: exit 0, on stdout, naming that (sub)command's own flags.
TEST(CliArgs, HelpPerSubcommand) {
  const std::pair<std::string, std::string> cases[] = {
      {"--help", "demo-data"},
      {"pack --help", "--overwrite"},
      {"demo-data --help", "--camera-names"},
      {"inspect --help", "--sample"},
      {"ckpt --help", "restore"},
      {"ckpt gc --help", "--dry-run"},
      {"ckpt export --help", "--out"},
      {"mem replay --help", "--segment-mb"},
      {"bench loader --help", "--token-buckets"},
      {"info --help", "--json"},
  };
  for (const auto& [args, flag] : cases) {
    CliResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    EXPECT_NE(r.out.find(flag), std::string::npos) << args << "\n" << r.out;
  }
  // The subcommand's help, not its parent's: gc's page has no restore --out.
  CliResult gc = RunCli("ckpt gc --help");
  EXPECT_EQ(gc.out.find("--out"), std::string::npos) << gc.out;
}

// Guards the usage-error contract: exit code 2, nothing on stdout, and exactly one stderr line
// "loongforge <command>: error: ..." that names the command whose usage was wrong.
TEST(CliArgs, UsageErrorsExitTwoWithOneLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"frobnicate", "loongforge: error: "},
      {"pack --src x", "loongforge pack: error: "},                        // --out missing
      {"pack --src x --out y --bogus", "loongforge pack: error: "},        // unknown flag
      {"pack --src x --out y --horizon two", "loongforge pack: error: "},  // not an integer
      {"demo-data --out x --size 64", "loongforge demo-data: error: "},
      {"ckpt", "loongforge ckpt: error: "},
      {"ckpt restore somewhere", "loongforge ckpt restore: error: "},  // --out missing
      {"ckpt ls somewhere --step 3", "loongforge ckpt ls: error: "},   // not a flag of ls
      {"ckpt show somewhere --step abc", "loongforge ckpt show: error: "},
      {"mem frobnicate t.trace", "loongforge mem: error: "},
      {"bench", "loongforge bench: error: "},
      {"bench loader --db x --token-buckets 64,0", "loongforge bench loader: error: "},
      {"bench loader --db x --device tpu", "loongforge bench loader: error: "},
  };
  for (const auto& [args, prefix] : cases) {
    CliResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
    EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
  }
  CliResult none = RunCli("");  // no command: the overview, and a usage exit code
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("Subcommands:"), std::string::npos) << none.err;
}

// Guards option binding: values (a list, a size, a count given or implied) reach the library.
TEST(CliArgs, FlagsReachTheLibrary) {
  const fs::path dir = fs::temp_directory_path() / ("lf_cli_args_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // --camera-names without --cameras: the list sets the count.
  CliResult r = RunCli("demo-data --quiet --out " + (dir / "raw").string() +
                       " --episodes 1 --camera-names left,right --size 40x30 --steps-min 3"
                       " --steps-max 3 --state-dim 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCli("pack --quiet --horizon 2 --src " + (dir / "raw").string() + " --out " +
             (dir / "db").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCli("inspect " + (dir / "db").string() + " --json --sample 2");  // flags after DB
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["schema"]["cameras"], (std::vector<std::string>{"left", "right"}));
  EXPECT_EQ(j["schema"]["state_dim"], 5);
  EXPECT_EQ(j["schema"]["action_horizon"], 2);
  EXPECT_EQ(j["sample"]["cameras"]["left"]["width"], 40);
  r = RunCli("--version --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(nlohmann::json::parse(r.out, nullptr, false).is_discarded()) << r.out;
  r = RunCli("version");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("loongforge ", 0), 0u) << r.out;
  fs::remove_all(dir);
}

// Guards `info --env`: every declared knob is listed with its doc, a set value is shown, and a
// bad one is named with the reason (the listing still exits 0: it reports, it does not run).
TEST(CliArgs, InfoEnvListsEveryKnob) {
  setenv("LOONGFORGE_MEM_SEGMENT_MB", "lots", 1);
  CliResult r = RunCli("info --env");
  CliResult j = RunCli("info --env --json");
  unsetenv("LOONGFORGE_MEM_SEGMENT_MB");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t n = 0;
  const EnvKnob* t = EnvKnobTable(&n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NE(r.out.find(std::string(t[i].name) + "\n"), std::string::npos) << t[i].name;
    EXPECT_NE(r.out.find(t[i].doc), std::string::npos) << t[i].name;
  }
  EXPECT_NE(r.out.find("LOONGFORGE_MEM_SEGMENT_MB='lots': not an integer"), std::string::npos)
      << r.out;
  ASSERT_EQ(j.exit_code, 0) << j.err;
  nlohmann::json rows = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << j.out;
  ASSERT_EQ(rows.size(), n);
  for (const auto& row : rows) {
    if (row["name"] == "LOONGFORGE_MEM_SEGMENT_MB") {
      EXPECT_EQ(row["current"], "lots");
      EXPECT_EQ(row["valid"], false);
    }
  }
}

}  // namespace
}  // namespace loongforge
