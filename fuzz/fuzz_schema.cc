// Dataset schema record (__schema__, Schema::FromJson) and the token record check a reader runs
// before ids reach an embedding table (CheckTokens). Input: schema JSON, then optionally a NUL byte
// and a "{id}_tokens" record to check against the parsed schema.
#include <cstdint>
#include <string_view>

#include "loongforge/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  std::string_view schema_json = in.substr(0, nul);
  auto schema = loongforge::data::Schema::FromJson(schema_json, "fuzz/db");
  if (!schema.ok()) return 0;
  (void)schema->ToJson();
  if (nul != std::string_view::npos) {
    (void)loongforge::data::CheckTokens(in.substr(nul + 1), *schema, "fuzz/db", "00000000_tokens");
  }
  return 0;
}
