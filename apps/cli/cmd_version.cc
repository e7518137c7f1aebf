// `loongforge info`: build information as text or JSON (same as --version).
#include <cstdio>

#include "cli.h"
#include "loongforge/build_info.h"

namespace loongforge {
namespace cli {
namespace {

int RunInfo(int argc, char** argv) {
  Args args("info", "[--json]");
  args.Switch("json", "print JSON");
  if (Status s = args.Parse(argc, argv); !s.ok()) return Fail("info", s);
  if (args.help_requested()) {
    std::printf("%s", args.Usage().c_str());
    return 0;
  }
  BuildInfo b = GetBuildInfo();
  std::printf("%s", args.Has("json") ? (b.ToJson() + "\n").c_str() : b.ToText().c_str());
  return 0;
}

}  // namespace
LF_CLI_COMMAND("info", "build information (same as --version)", RunInfo);
}  // namespace cli
}  // namespace loongforge
