// Small POSIX file helpers shared by the modules that publish files crash-consistently.
#pragma once

#include <string>

#include "loongforge/status.h"

namespace loongforge {
namespace internal {

// fsync()s directory `dir`, so that a rename or create inside it is durable. Errors name the
// directory (ENOSPC -> ResourceExhausted, ...).
Status SyncDir(const std::string& dir);

}  // namespace internal
}  // namespace loongforge
