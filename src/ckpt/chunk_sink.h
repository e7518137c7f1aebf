// Where the writer appends a segment's chunks: a POSIX WritableFile (host bytes only) or a cuFile
// segment (host bytes with pwrite, device bytes with cuFileWrite). Private to CheckpointVault.
//
// Note [cuFile writer]
// With writer=cufile the writer thread moves raw device-staged chunks (Note [Device staging] in
// snapshot.cc) from the staging arena straight to the segment file with cuFileWrite, instead of
// copying them through the two pinned host buffers and write(2). Everything else is unchanged:
//   - The segment layout is the POSIX writer's: chunks are appended in the same order (host-staged
//     chunks first, then device-staged ones per device), so the file is byte-identical. A chunk the
//     writer may compress or XOR-delta code (compress / xor_delta on) needs its bytes on the host
//     to decide, so with either option on every chunk goes the POSIX way (stats say so).
//   - Runs: chunks adjacent in the arena are adjacent in the file, so a run of them goes in one
//     cuFileWrite of up to max(d2h_buffer_bytes, chunk_bytes) bytes (larger IOs for cuFile).
//   - Durability: cuFile does not fsync; the sink's Sync() is fsync(2) of the file, then the
//     directory fsync and the atomic manifest commit follow as before.
//   - Errors: a negative cuFileWrite return (-1 with errno, or -CUfileOpError) or a zero-byte
//     write becomes a Status naming the segment file, the chunk and the cuFile error; ENOSPC maps
//     to ResourceExhausted like write(2), and the vault removes the partial segment (older
//     checkpoints stay intact).
//   - Registration: each staging arena is registered once with cuFileBufRegister (by the writer,
//     on first use) and deregistered before it is freed (arena growth, Close). A file is
//     registered (cuFileHandleRegister) when its sink is created and deregistered before close.
//   - Compat mode: where the nvidia-fs driver is absent, cuFile runs its own POSIX path (bounce
//     buffers + pwrite). The session allows it before opening the driver
//     (cuFileSetParameterBool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, true); a cufile.json named
//     by CUFILE_ENV_PATH_JSON applies too). In compat mode the file is registered through a
//     buffered descriptor; with nvidia-fs loaded through a second, O_DIRECT descriptor (as GDS
//     requires), host bytes and fsync always use the buffered one.
// The files named *cufile* are compiled only where libcufile and cufile.h are found
// (LOONGFORGE_WITH_CUFILE); elsewhere OpenCufileSession() returns Unimplemented.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loongforge/ckpt.h"

namespace loongforge {
namespace ckpt {
namespace internal {

// Appends chunks of one segment file. One writer thread.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  virtual Status AppendHost(const void* data, size_t len) = 0;
  // Appends `len` bytes of device memory at `dptr` (inside a buffer registered with the session,
  // or any device memory). `what` names the chunk in errors. FailedPrecondition on a POSIX sink.
  virtual Status AppendDevice(const void* dptr, size_t len, const std::string& what) = 0;
  virtual Status Sync() = 0;  // fsync
  virtual Status Close() = 0;
};

// A sink over an Env file (host bytes only).
std::unique_ptr<ChunkSink> NewPosixChunkSink(std::unique_ptr<WritableFile> file);

// One cuFile driver session of a vault (cuFileDriverOpen .. cuFileDriverClose), with the device
// buffers it registered. Thread-safe.
class CufileSession {
 public:
  virtual ~CufileSession() = default;  // deregisters every buffer left, closes the driver
  // E.g. "compat mode (nvidia-fs not loaded)" or "GPUDirect (nvidia-fs 2.17)".
  virtual std::string mode() const = 0;
  // Registers [base, base + bytes) on CUDA device `device` once (cuFileBufRegister; a no-op if
  // `base` is registered with at least `bytes`). A failure is returned, and writes from the buffer
  // still work unregistered (cuFile bounce buffers).
  virtual Status RegisterBuffer(int device, const void* base, int64_t bytes) = 0;
  // Deregisters `base` if registered (before the memory is freed).
  virtual void DeregisterBuffer(const void* base) = 0;
  // Creates or truncates `path` and registers it with cuFile.
  virtual StatusOr<std::unique_ptr<ChunkSink>> NewSink(const std::string& path) = 0;
};

// True when the cuFile writer is compiled in.
bool CufileCompiled();
// Opens the cuFile driver (compat mode allowed). Unimplemented ("cufile: not built ...") without
// cuFile; Unavailable ("cufile: cuFileDriverOpen failed: ...") when the driver does not open.
StatusOr<std::unique_ptr<CufileSession>> OpenCufileSession();

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
