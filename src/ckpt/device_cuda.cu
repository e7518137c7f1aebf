// XXH3-128 of fixed-size chunks of device memory, bit-identical to the CPU's XXH3_128bits, the
// batched asynchronous device snapshot (Note [Device snapshot] in device.h), device staging arenas
// and their background reader, and the host<->device copies CheckpointVault uses for restores
// into device tensors.
//
// Kernel shape: 8 threads per chunk, one per XXH3 accumulator lane (Note [Lane decomposition] in
// xxh3_lanes.h), one launch for every chunk of a batch (a descriptor per chunk); the 8 lanes meet
// through warp shuffles and lane 0 writes the 128-bit result. Chunks of <= 240 bytes (XXH3's short
// paths) are copied to the host and hashed there.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "ckpt/device.h"
#include "ckpt/xxh3_lanes.h"
#include "common/cuda_check.h"
#include "loongforge/metrics.h"

namespace loongforge {
namespace ckpt {
namespace internal {
namespace {

__constant__ uint8_t kSecretDev[xxh3::kSecretSize] = LF_XXH3_SECRET_BYTES;

constexpr int kThreadsPerBlock = 64;  // 8 chunks per block: many blocks spread over all SMs

// One chunk of a hash batch: `len` > 240 bytes at `data`, result into table slot `slot`.
struct ChunkDesc {
  const uint8_t* data;
  int64_t len;
  int64_t slot;
};

__global__ void HashChunksKernel(const ChunkDesc* desc, int64_t num_chunks,
                                 uint64_t* out /* 2 per slot */) {
  // The secret in shared memory: the 8 lanes of a chunk read 8 different words of it per stripe,
  // which constant memory would serialize.
  __shared__ __align__(16) uint8_t secret[xxh3::kSecretSize];
  for (int i = threadIdx.x; i < static_cast<int>(xxh3::kSecretSize); i += blockDim.x)
    secret[i] = kSecretDev[i];
  __syncthreads();
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = tid / 8;
  const int lane = static_cast<int>(tid % 8);
  const bool active = chunk < num_chunks;
  uint64_t acc = 0;
  size_t len = 0;
  int64_t slot = 0;
  if (active) {
    const ChunkDesc d = desc[chunk];
    len = static_cast<size_t>(d.len);
    slot = d.slot;
    acc = xxh3::LongLoopLane(d.data, len, secret, lane);
  }
  // Gather the 8 lanes of this chunk (lanes of one chunk are 8 consecutive threads of a warp).
  uint64_t accs[8];
  const unsigned mask = 0xffffffffu;
#pragma unroll
  for (int i = 0; i < 8; ++i) accs[i] = __shfl_sync(mask, acc, i, 8);
  if (active && lane == 0) {
    uint64_t lo, hi;
    xxh3::Finalize128(accs, len, secret, &lo, &hi);
    out[2 * slot] = lo;
    out[2 * slot + 1] = hi;
  }
}

// Waits for `ev` by polling (cudaEventSynchronize has no timeout).
Status WaitEvent(cudaEvent_t ev, int64_t timeout_ms, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady)
      return ::loongforge::internal::CudaErrorToStatus(e, what, __FILE__, __LINE__);
    if (std::chrono::steady_clock::now() > deadline)
      return DeadlineExceededError(std::string(what) + " did not complete within " +
                                   std::to_string(timeout_ms) + " ms");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// Note [Batched device copies]
// Device staging copies the whole training state (n16 + AdamW: ~4,400 tensors, 24 GB) inside the
// caller's step. One cudaMemcpyAsync per tensor cost ~70 ms of host time on the H200 while the
// training stream was busy: the copies wait (on the GPU) behind the step's queued work, and once a
// stream holds about a thousand pending commands the next launch blocks the host until the GPU
// drains some. A first batched version uploaded piece descriptors from a pinned buffer allocated
// on the first save, which put cudaMallocHost and a wait for the previous upload inside Save().
// Here the descriptors travel as kernel parameters (up to kCopyItems tensors per launch in a
// 32 KB __grid_constant__ block; CUDA 12.1+ on sm_70+): nothing to allocate, upload or recycle,
// and n16's state takes five launches. Block b copies piece b (kCopyPiece bytes) of the launch's
// tensors, found by binary search over their first pieces; 16-byte words when both ends are
// 16-byte aligned (allocator and arena offsets are), bytes otherwise. The copy itself runs at HBM
// speed on the vault's stream.
constexpr int64_t kCopyPiece = int64_t{1} << 20;
constexpr int kCopyThreads = 512;
constexpr int kCopyItems = 1000;

struct CopyItem {
  const uint8_t* src;
  uint8_t* dst;
  int64_t len;
  int64_t first_piece;  // the launch's piece index of this item's first byte
};

struct CopyItems {
  int32_t n = 0;
  CopyItem item[kCopyItems];
};
static_assert(sizeof(CopyItems) <= 32764, "kernel parameters are limited to 32,764 bytes");

__global__ void __launch_bounds__(kCopyThreads)
    CopyItemsKernel(const __grid_constant__ CopyItems items) {
  const int64_t piece = blockIdx.x;
  int lo = 0, hi = items.n - 1;  // the last item whose first_piece <= piece
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (items.item[mid].first_piece <= piece)
      lo = mid;
    else
      hi = mid - 1;
  }
  const CopyItem& it = items.item[lo];
  const int64_t off = (piece - it.first_piece) * kCopyPiece;
  const int64_t len = min(kCopyPiece, it.len - off);
  if (len <= 0) return;
  const uint8_t* src = it.src + off;
  uint8_t* dst = it.dst + off;
  int64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    const int64_t words = len / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) d[i] = s[i];
    done = words * 16;
  }
  for (int64_t i = done + threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
}

// The device-to-device copies of one snapshot (Note [Batched device copies]): Add collects them,
// Launch queues them on `stream` in as few launches as the parameter block allows.
class CopyBatch {
 public:
  void Clear() { items_.clear(); }

  void Add(void* dst, const void* src, size_t n) {
    if (n > 0)
      items_.push_back({static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst),
                        static_cast<int64_t>(n), 0});
  }

  // Call on the device, with `stream` ordered after the producers.
  Status Launch(cudaStream_t stream) {
    auto p = std::make_unique<CopyItems>();  // 32 KB: not on the stack
    for (size_t i = 0; i < items_.size();) {
      p->n = 0;
      int64_t pieces = 0;
      for (; i < items_.size() && p->n < kCopyItems; ++i) {
        CopyItem it = items_[i];
        const int64_t np = (it.len + kCopyPiece - 1) / kCopyPiece;
        if (pieces + np > (int64_t{1} << 31) - 1) break;  // grid x limit (never with real states)
        it.first_piece = pieces;
        p->item[p->n++] = it;
        pieces += np;
      }
      CopyItemsKernel<<<static_cast<unsigned>(pieces), kCopyThreads, 0, stream>>>(*p);
      LF_CUDA_CHECK_LAUNCH();
    }
    items_.clear();
    return Status::Ok();
  }

 private:
  std::vector<CopyItem> items_;
};

// Chunk hashes of many device ranges with one kernel launch: descriptors go to the device in one
// transfer, the table comes back in one; chunks of <= 240 bytes (XXH3's short paths) are copied
// to the host and hashed there. Owned by one stream's user; not thread-safe.
class HashBatch {
 public:
  ~HashBatch() {
    if (desc_copied_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(desc_copied_));
    if (fetched_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(fetched_));
    if (d_desc_) LF_CUDA_WARN_IF_ERROR(cudaFree(d_desc_));
    if (h_desc_) LF_CUDA_WARN_IF_ERROR(cudaFreeHost(h_desc_));
    if (d_table_) LF_CUDA_WARN_IF_ERROR(cudaFree(d_table_));
    if (h_table_) LF_CUDA_WARN_IF_ERROR(cudaFreeHost(h_table_));
    if (h_tails_) LF_CUDA_WARN_IF_ERROR(cudaFreeHost(h_tails_));
  }

  Status Init() {
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&desc_copied_, cudaEventDisableTiming));
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&fetched_, cudaEventDisableTiming));
    return Status::Ok();
  }

  // Starts a batch of `num_slots` chunks in at most `max_ranges` ranges. Call on the device.
  Status Reset(int64_t num_slots, int64_t max_ranges) {
    if (num_slots > slots_cap_) {
      // A previous launch may still read h_desc_; the tables are only reused after Fetch.
      LF_RETURN_IF_ERROR(WaitEvent(desc_copied_, kDrainTimeoutMs, "hash descriptor upload"));
      if (d_table_) LF_CUDA_RETURN_IF_ERROR(cudaFree(d_table_));
      if (h_table_) LF_CUDA_RETURN_IF_ERROR(cudaFreeHost(h_table_));
      if (d_desc_) LF_CUDA_RETURN_IF_ERROR(cudaFree(d_desc_));
      if (h_desc_) LF_CUDA_RETURN_IF_ERROR(cudaFreeHost(h_desc_));
      d_table_ = h_table_ = nullptr;
      d_desc_ = h_desc_ = nullptr;
      slots_cap_ = 0;
      const size_t n = static_cast<size_t>(num_slots);
      LF_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_table_, n * 16));
      LF_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h_table_, n * 16));
      LF_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_desc_, n * sizeof(ChunkDesc)));
      LF_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h_desc_, n * sizeof(ChunkDesc)));
      slots_cap_ = num_slots;
    }
    if (max_ranges > tails_cap_) {
      if (h_tails_) LF_CUDA_RETURN_IF_ERROR(cudaFreeHost(h_tails_));
      h_tails_ = nullptr;
      tails_cap_ = 0;
      LF_CUDA_RETURN_IF_ERROR(
          cudaMallocHost(&h_tails_, static_cast<size_t>(max_ranges) * xxh3::kMidSizeMax));
      tails_cap_ = max_ranges;
    }
    num_slots_ = num_slots;
    descs_.clear();
    tails_.clear();
    return Status::Ok();
  }

  // Adds the chunks of [data, data + nbytes) as slots [first_slot, ...). A short last chunk is
  // copied to the host on `stream` right away.
  Status Add(const uint8_t* data, int64_t nbytes, int64_t chunk_bytes, int64_t first_slot,
             cudaStream_t stream) {
    if (nbytes <= 0) return Status::Ok();
    if (chunk_bytes <= static_cast<int64_t>(xxh3::kMidSizeMax))
      return InvalidArgumentError("device chunk hashing: chunk_bytes must exceed 240");
    const int64_t num_chunks = (nbytes + chunk_bytes - 1) / chunk_bytes;
    if (first_slot < 0 || first_slot + num_chunks > num_slots_)
      return InternalError("device chunk hashing: slots out of range");
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t len = std::min(chunk_bytes, nbytes - c * chunk_bytes);
      if (len > static_cast<int64_t>(xxh3::kMidSizeMax)) {
        descs_.push_back({data + c * chunk_bytes, len, first_slot + c});
        continue;
      }
      if (static_cast<int64_t>(tails_.size()) >= tails_cap_)
        return InternalError("device chunk hashing: more short chunks than ranges");
      uint8_t* dst = h_tails_ + tails_.size() * xxh3::kMidSizeMax;
      LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, data + c * chunk_bytes, static_cast<size_t>(len),
                                              cudaMemcpyDeviceToHost, stream));
      tails_.push_back({first_slot + c, len});
    }
    return Status::Ok();
  }

  // Uploads the descriptors and launches one kernel for every chunk added since Reset.
  Status Launch(cudaStream_t stream) {
    if (descs_.empty()) return Status::Ok();
    LF_RETURN_IF_ERROR(WaitEvent(desc_copied_, kDrainTimeoutMs, "hash descriptor upload"));
    std::memcpy(h_desc_, descs_.data(), descs_.size() * sizeof(ChunkDesc));
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_desc_, h_desc_, descs_.size() * sizeof(ChunkDesc),
                                            cudaMemcpyHostToDevice, stream));
    LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(desc_copied_, stream));
    const int64_t n = static_cast<int64_t>(descs_.size());
    const int64_t blocks = (n * 8 + kThreadsPerBlock - 1) / kThreadsPerBlock;
    HashChunksKernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(d_desc_, n,
                                                                                     d_table_);
    LF_CUDA_CHECK_LAUNCH();
    return Status::Ok();
  }

  // Copies the table back in one transfer, waits (bounded) and fills out[slot].
  Status Fetch(cudaStream_t stream, int64_t timeout_ms, std::vector<Hash128>* out) {
    out->assign(static_cast<size_t>(num_slots_), Hash128{});
    if (num_slots_ == 0) return Status::Ok();
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        h_table_, d_table_, static_cast<size_t>(num_slots_) * 16, cudaMemcpyDeviceToHost, stream));
    LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(fetched_, stream));
    LF_RETURN_IF_ERROR(WaitEvent(fetched_, timeout_ms, "device chunk hashing"));
    for (const ChunkDesc& d : descs_) {
      const size_t i = static_cast<size_t>(d.slot);
      (*out)[i].lo = h_table_[2 * i];
      (*out)[i].hi = h_table_[2 * i + 1];
    }
    for (size_t k = 0; k < tails_.size(); ++k)
      (*out)[static_cast<size_t>(tails_[k].slot)] =
          HashBytes(h_tails_ + k * xxh3::kMidSizeMax, static_cast<size_t>(tails_[k].len));
    return Status::Ok();
  }

 private:
  static constexpr int64_t kDrainTimeoutMs = 60 * 1000;
  struct Tail {
    int64_t slot, len;
  };
  cudaEvent_t desc_copied_ = nullptr, fetched_ = nullptr;
  ChunkDesc* d_desc_ = nullptr;
  ChunkDesc* h_desc_ = nullptr;  // pinned
  uint64_t* d_table_ = nullptr;  // 2 words per slot
  uint64_t* h_table_ = nullptr;  // pinned mirror
  uint8_t* h_tails_ = nullptr;   // pinned, kMidSizeMax bytes per short chunk
  int64_t slots_cap_ = 0, tails_cap_ = 0, num_slots_ = 0;
  std::vector<ChunkDesc> descs_;
  std::vector<Tail> tails_;
};

}  // namespace

bool DeviceSupportCompiled() { return true; }

Status DeviceHashChunks(const void* dptr, int64_t nbytes, int64_t chunk_bytes, int device,
                        std::vector<Hash128>* out) {
  out->clear();
  if (nbytes <= 0) return Status::Ok();
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  HashBatch batch;
  LF_RETURN_IF_ERROR(batch.Init());
  LF_RETURN_IF_ERROR(batch.Reset((nbytes + chunk_bytes - 1) / chunk_bytes, 1));
  LF_RETURN_IF_ERROR(
      batch.Add(static_cast<const uint8_t*>(dptr), nbytes, chunk_bytes, 0, /*stream=*/0));
  LF_RETURN_IF_ERROR(batch.Launch(/*stream=*/0));
  return batch.Fetch(/*stream=*/0, /*timeout_ms=*/10 * 60 * 1000, out);
}

namespace {

// Makes `device` current for a scope and restores the caller's device after (Save runs on the
// caller's thread, whose current device belongs to the caller).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (prev_ >= 0) LF_CUDA_WARN_IF_ERROR(cudaSetDevice(prev_));
  }
  cudaError_t status() const { return status_; }

 private:
  int prev_ = -1;
  cudaError_t status_ = cudaSuccess;
};

#define LF_CKPT_DEVICE_GUARD(device) \
  DeviceGuard _lf_guard(device);     \
  LF_CUDA_RETURN_IF_ERROR(_lf_guard.status())

class CudaDeviceArena final : public DeviceArena {
 public:
  explicit CudaDeviceArena(int device) : device_(device) {}
  ~CudaDeviceArena() override {
    DeviceGuard g(device_);
    if (ready_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(ready_));
    if (data_) LF_CUDA_WARN_IF_ERROR(cudaFree(data_));
  }
  Status Init(int64_t bytes) {
    LF_CKPT_DEVICE_GUARD(device_);
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    LF_CUDA_RETURN_IF_ERROR(cudaMalloc(&data_, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
    capacity_ = bytes;
    return Status::Ok();
  }
  int device() const override { return device_; }
  uint8_t* data() const override { return static_cast<uint8_t*>(data_); }
  int64_t capacity() const override { return capacity_; }
  // Recorded after the snapshot's copies into this arena (Publish).
  cudaEvent_t ready() const { return ready_; }

 private:
  int device_;
  void* data_ = nullptr;
  int64_t capacity_ = 0;
  cudaEvent_t ready_ = nullptr;
};

// What the device snapshot (the caller's thread) and the staging reader (the writer thread) each
// own on their device: a non-blocking stream, a completion event on it and a hash batch.
class DeviceStreamOwner {
 protected:
  explicit DeviceStreamOwner(int device) : device_(device) {}
  ~DeviceStreamOwner() {
    DeviceGuard g(device_);
    batch_.reset();
    if (done_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(done_));
    if (stream_) LF_CUDA_WARN_IF_ERROR(cudaStreamDestroy(stream_));
  }
  // Call with device_ current.
  Status InitStream() {
    LF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    batch_ = std::make_unique<HashBatch>();
    return batch_->Init();
  }

  int device_;
  cudaStream_t stream_ = nullptr;  // owned
  cudaEvent_t done_ = nullptr;
  std::unique_ptr<HashBatch> batch_;
};

class CudaDeviceSnapshot final : public DeviceSnapshot, DeviceStreamOwner {
 public:
  explicit CudaDeviceSnapshot(int device) : DeviceStreamOwner(device) {}
  ~CudaDeviceSnapshot() override {
    DeviceGuard g(device_);
    for (cudaEvent_t e : producer_events_) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(e));
  }

  Status Init() {
    LF_CKPT_DEVICE_GUARD(device_);
    // Note [Kernel loading]: CUDA loads a kernel on its first launch by default
    // (CUDA_MODULE_LOADING=LAZY), and loading may wait for the whole device to go idle: the first
    // save's copy launch then blocked the host until the caller's queued step finished (60 s
    // behind a held stream in CkptCuda.DeviceStagingOrdersCallerStream...). Loading both kernels
    // here moves that wait to the snapshot's creation, which reserve_device_staging() (the
    // trainer's prepare step) does ahead of the first save.
    cudaFuncAttributes attr;
    LF_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, CopyItemsKernel));
    LF_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, HashChunksKernel));
    copies_ = std::make_unique<CopyBatch>();
    return InitStream();
  }

  Status Begin(int64_t num_slots, int64_t num_tensors,
               const std::vector<void*>& producer_streams) override {
    LF_CKPT_DEVICE_GUARD(device_);
    copies_->Clear();
    LF_RETURN_IF_ERROR(batch_->Reset(num_slots, num_tensors));
    while (producer_events_.size() < producer_streams.size()) {
      cudaEvent_t e;
      LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      producer_events_.push_back(e);
    }
    for (size_t i = 0; i < producer_streams.size(); ++i) {
      LF_CUDA_RETURN_IF_ERROR(
          cudaEventRecord(producer_events_[i], static_cast<cudaStream_t>(producer_streams[i])));
      LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, producer_events_[i], 0));
    }
    return Status::Ok();
  }

  Status EnqueueHash(const void* dptr, int64_t nbytes, int64_t chunk_bytes,
                     int64_t first_slot) override {
    LF_CKPT_DEVICE_GUARD(device_);
    return batch_->Add(static_cast<const uint8_t*>(dptr), nbytes, chunk_bytes, first_slot, stream_);
  }

  Status SubmitHashes() override {
    LF_CKPT_DEVICE_GUARD(device_);
    return batch_->Launch(stream_);
  }

  Status FetchHashes(std::vector<Hash128>* out, int64_t timeout_ms) override {
    LF_CKPT_DEVICE_GUARD(device_);
    return batch_->Fetch(stream_, timeout_ms, out);
  }

  Status EnqueueCopy(void* host_dst, const void* dev_src, size_t n) override {
    if (n == 0) return Status::Ok();
    LF_CKPT_DEVICE_GUARD(device_);
    LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, dev_src, n, cudaMemcpyDeviceToHost, stream_));
    return Status::Ok();
  }

  // Note [Batched device copies]: collected here, launched by Publish.
  Status EnqueueDeviceCopy(void* dev_dst, const void* dev_src, size_t n) override {
    copies_->Add(dev_dst, dev_src, n);
    return Status::Ok();
  }

  Status Publish(DeviceArena* arena, const std::vector<void*>& producer_streams) override {
    LF_CKPT_DEVICE_GUARD(device_);
    LF_RETURN_IF_ERROR(copies_->Launch(stream_));
    cudaEvent_t ready = static_cast<CudaDeviceArena*>(arena)->ready();
    LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready, stream_));
    // Note [Caller stream waits]: the caller's later work on its stream runs after the copy.
    for (void* s : producer_streams)
      LF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), ready, 0));
    return Status::Ok();
  }

  Status Finish(int64_t timeout_ms) override {
    LF_CKPT_DEVICE_GUARD(device_);
    LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
    return WaitEvent(done_, timeout_ms, "device snapshot copies");
  }

 private:
  std::vector<cudaEvent_t> producer_events_;
  std::unique_ptr<CopyBatch> copies_;
};

class CudaStagingReader final : public StagingReader, DeviceStreamOwner {
 public:
  CudaStagingReader(int device, int64_t buffer_bytes)
      : DeviceStreamOwner(device), buffer_bytes_(buffer_bytes) {}
  ~CudaStagingReader() override {
    DeviceGuard g(device_);
    for (int k = 0; k < 2; ++k) {
      if (copied_[k]) LF_CUDA_WARN_IF_ERROR(cudaEventDestroy(copied_[k]));
      if (buf_[k]) LF_CUDA_WARN_IF_ERROR(cudaFreeHost(buf_[k]));
    }
  }

  Status Init() {
    LF_CKPT_DEVICE_GUARD(device_);
    for (int k = 0; k < 2; ++k) {
      LF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copied_[k], cudaEventDisableTiming));
      LF_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&buf_[k]),
                                            static_cast<size_t>(buffer_bytes_),
                                            cudaHostAllocDefault));
    }
    return InitStream();
  }

  int64_t buffer_bytes() const override { return buffer_bytes_; }

  Status Hash(DeviceArena* arena, const std::vector<DeviceSpan>& spans, int64_t chunk_bytes,
              std::vector<Hash128>* out, int64_t timeout_ms) override {
    LF_CKPT_DEVICE_GUARD(device_);
    LF_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(stream_, static_cast<CudaDeviceArena*>(arena)->ready(), 0));
    int64_t slots = 0;
    for (const DeviceSpan& sp : spans) slots += (sp.nbytes + chunk_bytes - 1) / chunk_bytes;
    LF_RETURN_IF_ERROR(batch_->Reset(slots, static_cast<int64_t>(spans.size())));
    int64_t slot = 0;
    for (const DeviceSpan& sp : spans) {
      LF_RETURN_IF_ERROR(
          batch_->Add(static_cast<const uint8_t*>(sp.data), sp.nbytes, chunk_bytes, slot, stream_));
      slot += (sp.nbytes + chunk_bytes - 1) / chunk_bytes;
    }
    LF_RETURN_IF_ERROR(batch_->Launch(stream_));
    return batch_->Fetch(stream_, timeout_ms, out);
  }

  Status CopyOut(const std::vector<DeviceSpan>& ranges, int64_t timeout_ms,
                 const std::function<Status(size_t, const uint8_t*)>& fn, double* wait_s) override {
    LF_CKPT_DEVICE_GUARD(device_);
    *wait_s = 0;
    // Batches of consecutive ranges that fill one buffer.
    std::vector<size_t> starts;
    int64_t fill = buffer_bytes_;
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (ranges[i].nbytes > buffer_bytes_)
        return InternalError("staging read of " + std::to_string(ranges[i].nbytes) +
                             " bytes exceeds the " + std::to_string(buffer_bytes_) +
                             "-byte host buffer");
      if (fill + ranges[i].nbytes > buffer_bytes_) {
        starts.push_back(i);
        fill = 0;
      }
      fill += ranges[i].nbytes;
    }
    starts.push_back(ranges.size());
    const size_t num_batches = starts.size() - 1;
    auto enqueue = [&](size_t b) -> Status {
      uint8_t* dst = buf_[b % 2];
      for (size_t i = starts[b]; i < starts[b + 1]; ++i) {
        LF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, ranges[i].data,
                                                static_cast<size_t>(ranges[i].nbytes),
                                                cudaMemcpyDeviceToHost, stream_));
        dst += ranges[i].nbytes;
      }
      LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_[b % 2], stream_));
      return Status::Ok();
    };
    auto run = [&]() -> Status {
      for (size_t b = 0; b < std::min<size_t>(2, num_batches); ++b) LF_RETURN_IF_ERROR(enqueue(b));
      for (size_t b = 0; b < num_batches; ++b) {
        const double t0 = NowSeconds();
        LF_RETURN_IF_ERROR(WaitEvent(copied_[b % 2], timeout_ms, "staging device-to-host copy"));
        *wait_s += NowSeconds() - t0;
        const uint8_t* p = buf_[b % 2];
        for (size_t i = starts[b]; i < starts[b + 1]; ++i) {
          LF_RETURN_IF_ERROR(fn(i, p));
          p += ranges[i].nbytes;
        }
        // Buffer b % 2 is free again: the transfer of batch b + 2 goes there.
        if (b + 2 < num_batches) LF_RETURN_IF_ERROR(enqueue(b + 2));
      }
      return Status::Ok();
    };
    Status s = run();
    if (!s.ok()) {
      // The pinned buffers are reused by the next call: no transfer may still be writing them.
      Status d = Drain(timeout_ms);
      if (!d.ok()) LF_LOG(ERROR) << "staging reader: " << d;
    }
    return s;
  }

 private:
  Status Drain(int64_t timeout_ms) {
    LF_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
    return WaitEvent(done_, timeout_ms, "staging reader drain");
  }

  int64_t buffer_bytes_;
  cudaEvent_t copied_[2] = {nullptr, nullptr};
  uint8_t* buf_[2] = {nullptr, nullptr};  // pinned, buffer_bytes_ each
};

}  // namespace

StatusOr<std::unique_ptr<DeviceSnapshot>> NewDeviceSnapshot(int device) {
  auto s = std::make_unique<CudaDeviceSnapshot>(device);
  LF_RETURN_IF_ERROR(s->Init());
  return std::unique_ptr<DeviceSnapshot>(std::move(s));
}

StatusOr<std::unique_ptr<DeviceArena>> NewDeviceArena(int device, int64_t bytes) {
  auto a = std::make_unique<CudaDeviceArena>(device);
  LF_RETURN_IF_ERROR(a->Init(bytes));
  return std::unique_ptr<DeviceArena>(std::move(a));
}

Status DeviceMemInfo(int device, int64_t* free_bytes, int64_t* total_bytes) {
  LF_CKPT_DEVICE_GUARD(device);
  size_t f = 0, t = 0;
  LF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&f, &t));
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
  return Status::Ok();
}

StatusOr<std::unique_ptr<StagingReader>> NewStagingReader(int device, int64_t buffer_bytes) {
  auto r = std::make_unique<CudaStagingReader>(device, buffer_bytes);
  LF_RETURN_IF_ERROR(r->Init());
  return std::unique_ptr<StagingReader>(std::move(r));
}

Status DeviceToHost(void* host_dst, const void* dev_src, size_t n, int device) {
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  LF_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_dst, dev_src, n, cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status HostToDevice(void* dev_dst, const void* host_src, size_t n, int device) {
  LF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  LF_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev_dst, host_src, n, cudaMemcpyHostToDevice));
  return Status::Ok();
}

void* AllocHost(size_t n, bool pinned) {
  if (n == 0) n = 1;
  if (pinned) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, n, cudaHostAllocDefault) == cudaSuccess) return p;
    cudaGetLastError();
    LF_LOG(WARNING) << "cudaHostAlloc(" << n << ") failed; staging in pageable memory";
    return nullptr;
  }
  return std::malloc(n);
}

void FreeHost(void* p, bool pinned) {
  if (p == nullptr) return;
  if (pinned) {
    LF_CUDA_WARN_IF_ERROR(cudaFreeHost(p));
  } else {
    std::free(p);
  }
}

}  // namespace internal
}  // namespace ckpt
}  // namespace loongforge
