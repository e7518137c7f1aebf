// What the two packers share: `pack` from episode folders (packer.cc) and `pack --from-lerobot`
// (lerobot_import.cc) check the same options, tokenize instructions under the same rule, compute
// the same statistics and write the same records of a sample. Private to src/dataset.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/thread_pool.h"
#include "loongforge/dataset.h"
#include "loongforge/status.h"
#include "loongforge/tokenizer.h"

namespace loongforge::data {

// Checks the options both packers take: horizon in 1..4096, threads in 0..kMaxPackThreads,
// max_instruction_bytes in 1..kMaxInstructionBytesLimit. InvalidArgument naming the option and
// the value given.
Status CheckSharedPackOptions(int horizon, int threads, int max_instruction_bytes);

// The token ids of `text`. A registered tokenizer is outside this library: ids past its
// vocabulary would index past a model's embedding table, so they never reach the DB:
// InvalidArgument naming the tokenizer, the id and `what` (the text's origin, e.g. "the
// instruction at steps.jsonl:3").
StatusOr<std::vector<int32_t>> EncodeChecked(const Tokenizer& tokenizer, const std::string& text,
                                             const std::string& what);

// Per dimension of `rows` (each `dims` floats): mean and population std (two passes, in double:
// exact enough for any dataset size), min and max.
void ComputeStats(const std::vector<const float*>& rows, size_t dims, std::vector<float>* mean,
                  std::vector<float>* std_out, std::vector<float>* min_out,
                  std::vector<float>* max_out);

// The action chunk of step t of an episode of n steps: the actions of steps t .. t+horizon-1
// (action_at(s) gives step s's `dims` floats), with mask 1; past the episode's end the last
// action repeats with mask 0. `chunk` holds horizon * dims floats, `amask` horizon bytes.
template <typename ActionAt>
void FillActionChunk(int64_t t, int64_t n, int horizon, int dims, const ActionAt& action_at,
                     float* chunk, uint8_t* amask) {
  for (int k = 0; k < horizon; ++k) {
    const int64_t s = t + k;
    amask[k] = s < n ? 1 : 0;
    const float* a = action_at(std::min(s, n - 1));
    std::copy(a, a + dims, chunk + static_cast<ptrdiff_t>(k) * dims);
  }
}

// The records of one sample, little-endian as the record store's readers expect.
// `jpegs` is one frame per camera, in the schema's camera order; `lerobot` is written
// only when not empty (pack --from-lerobot).
struct SampleRecords {
  std::string_view action, amask;
  std::vector<std::string_view> jpegs;
  std::string_view lerobot, meta, state;
  std::string_view task;  // the instruction's text (UTF-8), what `tokens` encodes
  std::string_view tokens;
};

// Puts the records of sample `id` in key order (action, amask, cam_*, lerobot, meta, state, task,
// tokens: LMDB appends keys in order cheaply) and adds the JPEG bytes to *jpeg_bytes. The
// writer's error, naming the DB, on failure.
Status PutSample(RecordWriter* writer, int64_t id, const std::vector<std::string>& cameras,
                 const SampleRecords& records, int64_t* jpeg_bytes);

// The bytes of `n` values at `p`, as a record value.
template <typename T>
std::string_view AsBytes(const T* p, size_t n) {
  return std::string_view(reinterpret_cast<const char*>(p), n * sizeof(T));
}
template <typename T>
std::string_view AsBytes(const std::vector<T>& v) {
  return AsBytes(v.data(), v.size());
}

// Runs task(0), task(1), ... task(n-1) on `pool` at most `window` tasks ahead of the single
// consumer, which takes the results in order with Take(): the packers' readers run in parallel
// while their writer puts records in order. Tasks reference the caller's locals, so Fail() and the
// destructor set `cancel` (tasks check it and return at once) and wait for every task in flight,
// the one Take() gave up on after its timeout included (it stays in the window until done).
template <typename T>
class OrderedWindow {
 public:
  OrderedWindow(ThreadPool* pool, size_t n, size_t window, std::atomic<bool>* cancel,
                std::function<T(size_t)> task)
      : pool_(pool), n_(n), window_(window), cancel_(cancel), task_(std::move(task)) {}
  OrderedWindow(const OrderedWindow&) = delete;
  OrderedWindow& operator=(const OrderedWindow&) = delete;
  ~OrderedWindow() { CancelAndWait(); }

  // Submits tasks up to the window, then waits for the next task's result (at most `timeout`
  // when given) and returns it. DeadlineExceeded (empty message: the caller names the task) when
  // it is not ready in time; Cancelled when the pool is shut down. Call at most n times.
  StatusOr<T> Take(std::optional<std::chrono::seconds> timeout = std::nullopt) {
    while (submitted_ < n_ && submitted_ < taken_ + window_) {
      const size_t i = submitted_++;
      inflight_.push_back(pool_->Async([this, i] { return task_(i); }));
      if (!inflight_.back().valid()) return CancelledError("pack: thread pool shut down");
    }
    std::future<T>& f = inflight_.front();
    if (timeout && f.wait_for(*timeout) != std::future_status::ready)
      return DeadlineExceededError("");
    T out = f.get();
    inflight_.pop_front();
    ++taken_;
    return out;
  }

  // Cancels the tasks not yet done and waits for those in flight; returns `s`.
  Status Fail(Status s) {
    CancelAndWait();
    return s;
  }

 private:
  void CancelAndWait() {
    cancel_->store(true);
    for (auto& f : inflight_)
      if (f.valid()) f.wait();
  }

  ThreadPool* pool_;
  const size_t n_, window_;
  std::atomic<bool>* cancel_;
  std::function<T(size_t)> task_;
  std::deque<std::future<T>> inflight_;
  size_t submitted_ = 0, taken_ = 0;
};

}  // namespace loongforge::data
