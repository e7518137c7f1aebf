// `loongforge info` (alias `version`): build information as text or JSON (same as --version).
#include <cstdio>
#include <memory>

#include "cli.h"
#include "loongforge/build_info.h"

namespace loongforge {
namespace cli {
namespace {

void AddInfo(CLI::App& root) {
  auto json = std::make_shared<bool>(false);
  CLI::App* app = AddCommand(root, "info", "build information (same as --version)", [json] {
    BuildInfo b = GetBuildInfo();
    std::printf("%s", *json ? (b.ToJson() + "\n").c_str() : b.ToText().c_str());
    return Status::Ok();
  });
  app->alias("version");
  app->add_flag("--json", *json, "print JSON");
}

}  // namespace
LF_CLI_COMMAND(AddInfo);
}  // namespace cli
}  // namespace loongforge
