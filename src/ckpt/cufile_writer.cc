// cuFile (GPUDirect Storage) segment writer: Note [cuFile writer] in chunk_sink.h. Compiled only
// where cufile.h and libcufile are found (LOONGFORGE_WITH_CUFILE).
#include <cuda_runtime_api.h>
#include <cufile.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "ckpt/chunk_sink.h"
#include "loongforge/logging.h"

namespace loongforge {
namespace ckpt {
namespace internal {
namespace {

std::string CufileErrorText(const CUfileError_t& e) {
  std::string s = cufileop_status_error(e.err);
  s += " (CUfileOpError " + std::to_string(static_cast<int>(e.err));
  if (IS_CUDA_ERR(e)) s += ", CUresult " + std::to_string(static_cast<int>(e.cu_err));
  return s + ")";
}

// Status of a negative cuFileWrite return: -1 with errno, -errno (compat path) or -CUfileOpError.
Status WriteErrorStatus(ssize_t ret, int saved_errno, const std::string& what) {
  if (ret == -1) return ErrnoToStatus(saved_errno != 0 ? saved_errno : EIO, what);
  const long v = -static_cast<long>(ret);
  if (IS_CUFILE_ERR(v))
    return InternalError(what + ": " + CUFILE_ERRSTR(v) + " (CUfileOpError " + std::to_string(v) +
                         ")");
  return ErrnoToStatus(static_cast<int>(v), what);
}

struct Registered {
  int device = -1;
  int64_t bytes = 0;
  bool ok = false;  // cuFileBufRegister succeeded (else writes go unregistered)
};

class CufileSink : public ChunkSink {
 public:
  CufileSink(std::string path, int fd, int dio_fd, CUfileHandle_t fh,
             std::map<const uint8_t*, Registered>* regs, std::mutex* regs_mu)
      : path_(std::move(path)), fd_(fd), dio_fd_(dio_fd), fh_(fh), regs_(regs), regs_mu_(regs_mu) {}
  ~CufileSink() override { Close().IgnoreError(); }

  Status AppendHost(const void* data, size_t len) override {
    const char* p = static_cast<const char*>(data);
    while (len > 0) {
      ssize_t n = ::pwrite(fd_, p, len, off_);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "write " + path_);
      }
      if (n == 0) return InternalError("write " + path_ + ": pwrite wrote 0 bytes");
      p += n;
      off_ += n;
      len -= static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  Status AppendDevice(const void* dptr, size_t len, const std::string& what) override {
    const std::string where = "cuFileWrite " + path_ + " (" + what + ")";
    if (fh_ == nullptr) return FailedPreconditionError(where + ": the file is closed");
    // A registered buffer is addressed as base + offset (cuFile looks its registration up by base).
    const uint8_t* p = static_cast<const uint8_t*>(dptr);
    const uint8_t* base = p;
    int device = -1;
    {
      std::lock_guard<std::mutex> l(*regs_mu_);
      auto it = regs_->upper_bound(p);
      if (it != regs_->begin()) {
        --it;
        if (p + len <= it->first + it->second.bytes) {
          device = it->second.device;
          if (it->second.ok) base = it->first;
        }
      }
    }
    if (device >= 0 && device != current_device_) {
      cudaError_t ce = cudaSetDevice(device);
      if (ce != cudaSuccess)
        return InternalError(where + ": cudaSetDevice(" + std::to_string(device) +
                             "): " + cudaGetErrorString(ce));
      current_device_ = device;
    }
    size_t done = 0;
    while (done < len) {
      errno = 0;
      ssize_t n = cuFileWrite(fh_, base, len - done, static_cast<off_t>(off_),
                              static_cast<off_t>(p - base) + static_cast<off_t>(done));
      const int saved = errno;
      if (n < 0) {
        if (n == -1 && saved == EINTR) continue;
        const std::string at = where + " at file offset " + std::to_string(off_) + ", " +
                               std::to_string(len - done) + " bytes";
        Status e = WriteErrorStatus(n, saved, at);
        // A cuFile-level error (not an errno) on a full file system still reads as disk full,
        // like write(2)'s ENOSPC.
        struct statvfs vfs;
        if (e.code() != StatusCode::kResourceExhausted && ::fstatvfs(fd_, &vfs) == 0 &&
            static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < len - done)
          return ResourceExhaustedError(
              e.message() + "; the file system has " +
              std::to_string(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize) +
              " bytes free (disk full)");
        return e;
      }
      if (n == 0)
        return InternalError(where + ": short write, 0 of " + std::to_string(len - done) +
                             " bytes at file offset " + std::to_string(off_));
      done += static_cast<size_t>(n);
      off_ += n;
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (fd_ < 0) return FailedPreconditionError("fsync " + path_ + ": the file is closed");
    if (::fsync(fd_) != 0) return ErrnoToStatus(errno, "fsync " + path_);
    return Status::Ok();
  }

  Status Close() override {
    if (fh_ != nullptr) {
      cuFileHandleDeregister(fh_);  // before the descriptor it names is closed
      fh_ = nullptr;
    }
    Status s;
    if (dio_fd_ >= 0) {
      if (::close(dio_fd_) != 0) s = ErrnoToStatus(errno, "close " + path_ + " (O_DIRECT)");
      dio_fd_ = -1;
    }
    if (fd_ >= 0) {
      if (::close(fd_) != 0 && s.ok()) s = ErrnoToStatus(errno, "close " + path_);
      fd_ = -1;
    }
    return s;
  }

 private:
  std::string path_;
  int fd_;      // buffered: host bytes, fsync
  int dio_fd_;  // O_DIRECT descriptor registered with cuFile (GPUDirect mode), else -1
  CUfileHandle_t fh_;
  std::map<const uint8_t*, Registered>* regs_;
  std::mutex* regs_mu_;
  int64_t off_ = 0;
  int current_device_ = -1;
};

class CufileSessionImpl : public CufileSession {
 public:
  explicit CufileSessionImpl(std::string mode, bool direct)
      : mode_(std::move(mode)), direct_(direct) {}
  ~CufileSessionImpl() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [base, r] : regs_)
        if (r.ok) {
          CUfileError_t e = cuFileBufDeregister(base);
          if (e.err != CU_FILE_SUCCESS)
            LF_LOG(WARNING) << "cuFileBufDeregister: " << CufileErrorText(e);
        }
      regs_.clear();
    }
    CUfileError_t e = cuFileDriverClose();
    if (e.err != CU_FILE_SUCCESS) LF_LOG(WARNING) << "cuFileDriverClose: " << CufileErrorText(e);
  }

  std::string mode() const override { return mode_; }

  Status RegisterBuffer(int device, const void* base, int64_t bytes) override {
    const uint8_t* b = static_cast<const uint8_t*>(base);
    std::lock_guard<std::mutex> l(mu_);
    auto it = regs_.find(b);
    if (it != regs_.end()) {
      if (it->second.bytes >= bytes && it->second.device == device) return Status::Ok();
      if (it->second.ok) cuFileBufDeregister(b);
      regs_.erase(it);
    }
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
      return InternalError("cuFileBufRegister: cudaSetDevice(" + std::to_string(device) +
                           "): " + cudaGetErrorString(ce));
    CUfileError_t e = cuFileBufRegister(base, static_cast<size_t>(bytes), 0);
    Registered r{device, bytes, e.err == CU_FILE_SUCCESS};
    regs_[b] = r;  // remembered either way: the device is needed for writes from it
    if (!r.ok)
      return UnavailableError("cuFileBufRegister of the " + std::to_string(bytes) +
                              "-byte staging arena on CUDA device " + std::to_string(device) +
                              ": " + CufileErrorText(e));
    return Status::Ok();
  }

  void DeregisterBuffer(const void* base) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = regs_.find(static_cast<const uint8_t*>(base));
    if (it == regs_.end()) return;
    if (it->second.ok) {
      CUfileError_t e = cuFileBufDeregister(base);
      if (e.err != CU_FILE_SUCCESS)
        LF_LOG(WARNING) << "cuFileBufDeregister: " << CufileErrorText(e);
    }
    regs_.erase(it);
  }

  StatusOr<std::unique_ptr<ChunkSink>> NewSink(const std::string& path) override {
    // O_RDWR, not O_WRONLY: cuFile reads back around unaligned writes (read-modify-write).
    // O_EXCL | O_NOFOLLOW: a new file, never a planted one (Note [Outputs are created, never
    // followed]); segment names are random.
    const int created =
        ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (created < 0) return ErrnoToStatus(errno, "create " + path);
    // cuFile refuses descriptors opened with O_EXCL / O_NOFOLLOW ("unsupported file open flags",
    // CUfileOpError 5019, seen on the H200): the file just created is reopened through its
    // descriptor's /proc link (the same inode, whatever the path now names) with plain flags.
    const std::string self = "/proc/self/fd/" + std::to_string(created);
    const int fd = ::open(self.c_str(), O_RDWR | O_CLOEXEC);
    const int reopen_errno = errno;
    ::close(created);
    if (fd < 0) return ErrnoToStatus(reopen_errno, "reopen " + path);
    const std::string self_fd = "/proc/self/fd/" + std::to_string(fd);
    // Register the plain descriptor, else an O_DIRECT one (GPUDirect needs O_DIRECT; compat mode
    // works with either, but some libcufile versions refuse one or the other): the first that
    // cuFile takes is used, and every refusal goes into the error.
    std::string tried;
    for (int attempt = 0; attempt < 2; ++attempt) {
      bool use_direct = (attempt == 0) == direct_;
      int dio_fd = -1;
      if (use_direct) {
        dio_fd = ::open(self_fd.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
        if (dio_fd < 0) {
          tried +=
              std::string(tried.empty() ? "" : "; ") + "O_DIRECT open: " + std::strerror(errno);
          continue;
        }
      }
      CUfileDescr_t descr{};
      descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
      descr.handle.fd = use_direct ? dio_fd : fd;
      CUfileHandle_t fh = nullptr;
      CUfileError_t e = cuFileHandleRegister(&fh, &descr);
      if (e.err == CU_FILE_SUCCESS)
        return std::unique_ptr<ChunkSink>(new CufileSink(path, fd, dio_fd, fh, &regs_, &mu_));
      tried += std::string(tried.empty() ? "" : "; ") + (use_direct ? "O_DIRECT fd: " : "fd: ") +
               CufileErrorText(e);
      if (dio_fd >= 0) ::close(dio_fd);
    }
    ::close(fd);
    return UnavailableError("cuFileHandleRegister " + path + " (" + mode_ + "): " + tried);
  }

 private:
  std::string mode_;
  bool direct_;
  std::mutex mu_;
  std::map<const uint8_t*, Registered> regs_;
};

}  // namespace

bool CufileCompiled() { return true; }

StatusOr<std::unique_ptr<CufileSession>> OpenCufileSession() {
  // Compat mode must be allowed before the driver opens (it is where nvidia-fs is absent). If the
  // driver is already open in this process, its settings stand (CU_FILE_DRIVER_ALREADY_OPEN).
  CUfileError_t pe = cuFileSetParameterBool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, true);
  if (pe.err != CU_FILE_SUCCESS && pe.err != CU_FILE_DRIVER_ALREADY_OPEN)
    LF_LOG(WARNING) << "cuFileSetParameterBool(ALLOW_COMPAT_MODE): " << CufileErrorText(pe);
  // Without nvidia-fs there is no GPUDirect path to probe: force compat mode, so cuFile neither
  // tries the driver per file nor refuses descriptors it cannot hand to it.
  if (::access("/proc/driver/nvidia-fs", F_OK) != 0) {
    CUfileError_t fe = cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE, true);
    if (fe.err != CU_FILE_SUCCESS && fe.err != CU_FILE_DRIVER_ALREADY_OPEN)
      LF_LOG(WARNING) << "cuFileSetParameterBool(FORCE_COMPAT_MODE): " << CufileErrorText(fe);
  }
  CUfileError_t e = cuFileDriverOpen();
  if (e.err != CU_FILE_SUCCESS)
    return UnavailableError("cufile: cuFileDriverOpen failed: " + CufileErrorText(e));
  CUfileDrvProps_t props{};
  std::string mode;
  bool direct = false;
  CUfileError_t ge = cuFileDriverGetProperties(&props);
  if (ge.err != CU_FILE_SUCCESS) {
    mode = "compat mode assumed (cuFileDriverGetProperties: " + CufileErrorText(ge) + ")";
  } else if ((props.nvfs.major_version == 0 && props.nvfs.minor_version == 0) ||
             ::access("/proc/driver/nvidia-fs", F_OK) != 0) {
    mode = "compat mode (nvidia-fs not loaded)";
  } else {
    direct = true;
    mode = "GPUDirect (nvidia-fs " + std::to_string(props.nvfs.major_version) + "." +
           std::to_string(props.nvfs.minor_version) + ")";
  }
  bool force_compat = false;
  if (cuFileGetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE, &force_compat).err ==
          CU_FILE_SUCCESS &&
      force_compat) {
    direct = false;
    mode += ", force_compat_mode";
  }
  return std::unique_ptr<CufileSession>(new CufileSessionImpl(mode, direct));
}

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
