// `loongforge info` (alias `version`): build information as text or JSON (same as --version);
// `loongforge info --env`: every LOONGFORGE_* environment knob (src/common/env_knobs.cc) with its
// type, default, current value and doc, so a run's configuration can be read off one command.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli.h"
#include "loongforge/build_info.h"
#include "loongforge/env_knobs.h"

namespace loongforge {
namespace cli {
namespace {

// What the knob's current value is, as shown: "(unset)", the text, and why it is refused.
std::string CurrentText(const EnvKnob& k) {
  const char* raw = EnvRaw(k.name);
  if (raw == nullptr) return "(unset)";
  std::string s = std::string("'") + raw + "'";
  Status st = CheckEnvKnob(k.name);
  if (!st.ok()) s += " (invalid: " + st.message() + ")";
  return s;
}

void PrintKnobs(bool json) {
  size_t n = 0;
  const EnvKnob* t = EnvKnobTable(&n);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < n; ++i) {
      const EnvKnob& k = t[i];
      const char* raw = EnvRaw(k.name);
      Status st = CheckEnvKnob(k.name);
      nlohmann::json j = {{"name", k.name},
                          {"type", KnobTypeName(k.type)},
                          {"default", k.default_value},
                          {"current", raw != nullptr ? nlohmann::json(raw) : nlohmann::json()},
                          {"valid", st.ok()},
                          {"reader", k.reader},
                          {"doc", k.doc}};
      if (!st.ok()) j["error"] = st.message();
      if (k.type == KnobType::kString && k.choices[0] != '\0') j["choices"] = k.choices;
      out.push_back(j);
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const EnvKnob& k = t[i];
    std::string type = KnobTypeName(k.type);
    if (k.type == KnobType::kString && k.choices[0] != '\0')
      type += " (" + std::string(k.choices) + ")";
    std::printf("%s\n  type %s, default '%s', read by %s, current %s\n  %s\n", k.name, type.c_str(),
                k.default_value, k.reader, CurrentText(k).c_str(), k.doc);
  }
}

void AddInfo(CLI::App& root) {
  auto json = std::make_shared<bool>(false);
  auto env = std::make_shared<bool>(false);
  CLI::App* app = AddCommand(
      root, "info", "build information (same as --version); --env: the environment knobs",
      [json, env] {
        if (*env) {
          PrintKnobs(*json);
        } else {
          BuildInfo b = GetBuildInfo();
          std::printf("%s", *json ? (b.ToJson() + "\n").c_str() : b.ToText().c_str());
        }
        return Status::Ok();
      });
  app->alias("version");
  app->add_flag("--json", *json, "print JSON");
  app->add_flag("--env", *env,
                "list the LOONGFORGE_* environment knobs: type, default, current value, doc");
}

}  // namespace
LF_CLI_COMMAND(AddInfo);
}  // namespace cli
}  // namespace loongforge
