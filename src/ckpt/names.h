// File names of a CheckpointVault (Note [Vault layout] in vault_impl.h): manifests, segments and
// the temporary files of a commit. gc and List recognize the vault's files by these patterns
// only; anything else in the vault's directories belongs to someone else and is left alone.
#pragma once

#include <cstdint>
#include <string>

namespace loongforge {
namespace ckpt {
namespace internal {

// "ckpt-<step>.manifest", the step zero-padded to 12 digits (so that names of steps below 10^12
// sort by step; larger steps have more digits, and List sorts numerically).
std::string ManifestName(int64_t step);
// True, with *step set, for a name ManifestName produces (any number of digits, but exactly the
// spelling ManifestName gives the step: no sign, no extra leading zeros beyond the padding).
bool ParseManifestName(const std::string& name, int64_t* step);
// A temporary manifest of a commit: "ckpt-<step>.manifest.tmp" (older vaults) or
// ".ckpt-<step>.manifest.tmp.<suffix>" (TempFile-style names, Note [Outputs are created, never
// followed] in common/file_util.h).
bool IsManifestTempName(const std::string& name);
// A temporary manifest name for `step`, random, for a new file next to ManifestName(step).
std::string NewManifestTempName(int64_t step);

// "seg-<step:012>-<kind><8 hex>.lfs", random, for a new segment of a save (kind "") or a merge
// (kind "m").
std::string NewSegmentName(int64_t step, const char* kind);
// True for a name NewSegmentName can produce. gc deletes only these.
bool IsSegmentName(const std::string& name);

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
