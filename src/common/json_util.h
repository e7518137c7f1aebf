// Typed reads of one member of a JSON object that never throw. nlohmann's j.value(key, dflt) and
// j[key].get<T>() throw type_error when the member holds another type (or `j` is not an object),
// and the files and records these read come from users and disks: a wrong type must read as
// "absent" so that the caller's own check names the file and the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace loongforge::json_util {

// j[key] when `j` is an object holding an integer there; else `dflt`.
inline int64_t Int(const nlohmann::json& j, const char* key, int64_t dflt) {
  if (!j.is_object()) return dflt;
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : dflt;
}

// j[key] when `j` is an object holding a string there; else `dflt`.
inline std::string String(const nlohmann::json& j, const char* key, std::string dflt = {}) {
  if (!j.is_object()) return dflt;
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : dflt;
}

}  // namespace loongforge::json_util
