// Every LOONGFORGE_* environment variable ("knob"), declared once, in the spirit of NCCL_PARAM:
// its name, type, default and one line of doc live in the table of env_knobs.cc, and everything
// that reads one (the C++ core, the Python package through loongforge._C, `loongforge info
// --env`, docs/knobs.md) reads it through that table. A knob read anywhere but in the table
// would be a variable nobody can list, whose default and meaning live only at its reader.
//
//   int64_t cap_mb = EnvInt("LOONGFORGE_MEM_LIMIT_MB");        // bad value: warning, default
//   StatusOr<int64_t> v = ParseEnvInt("LOONGFORGE_MEM_LIMIT_MB");  // bad value: InvalidArgument
//
// Values: unset or empty means the default. int: a whole decimal integer (optional sign) within
// the knob's [min, max]; float: a finite decimal number; bool: 1/0, true/false, yes/no, on/off
// (any case); string: any text, or one of the knob's choices (any case) when it has them. A bad
// value's error names the variable and the value. Asking for an undeclared name, or for a knob
// as another type than its declared one, is a programming error: the process aborts with the
// name (in every build: the first call of the reader fails, in its tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "loongforge/status.h"

namespace loongforge {

enum class KnobType : int { kInt, kFloat, kBool, kString };

struct EnvKnob {
  const char* name;
  KnobType type;
  const char* default_value;  // as the variable would spell it
  const char* doc;            // one line: what it does, its unit
  const char* reader;         // who reads it: "core", "python", "bin/loongforge"
  int64_t min_value;          // kInt only: the smallest accepted value
  int64_t max_value;          // kInt only: the largest accepted value
  const char* choices;        // kString only: accepted values separated by '|', or "" for any
};

// "int", "float", "bool", "string".
const char* KnobTypeName(KnobType type);

// The table, in declaration order; `*count` receives its length.
const EnvKnob* EnvKnobTable(size_t* count);
// The knob named `name`, or nullptr when it is not declared.
const EnvKnob* FindEnvKnob(std::string_view name);

// The variable's text as set, or nullptr when unset or empty (the default applies).
const char* EnvRaw(const char* name);

// The knob's value: its default when unset or empty; InvalidArgument naming the variable and the
// value when the value does not parse or lies outside the knob's range or choices. Aborts for an
// undeclared name or a type other than the declared one.
StatusOr<int64_t> ParseEnvInt(const char* name);
StatusOr<double> ParseEnvFloat(const char* name);
StatusOr<bool> ParseEnvBool(const char* name);
StatusOr<std::string> ParseEnvString(const char* name);

// As above, but a bad value writes one warning line to stderr (naming the variable, the value and
// the default used instead) and gives the default: for readers that have no error path (logging,
// the CUDA launch check, the crash handler).
int64_t EnvInt(const char* name);
double EnvFloat(const char* name);
bool EnvBool(const char* name);
std::string EnvString(const char* name);

// The knob's current value checked against its declaration, whatever its type: Ok when unset,
// empty or valid, else the InvalidArgument of its Parse getter. Aborts for an undeclared name.
Status CheckEnvKnob(const char* name);

}  // namespace loongforge
