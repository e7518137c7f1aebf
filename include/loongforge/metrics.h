// Latency metrics: histograms with p50/p95/p99/std, scoped timers, and a registry of named
// histograms and counters that a component exposes as its metrics().
//
// Thread-safe. A Histogram keeps every sample up to `capacity` (default 1<<16) and then a uniform
// reservoir sample, so percentiles stay exact for benchmark-sized runs and bounded in memory for
// long ones. Units are the caller's; by convention names end in the unit ("decode_ms").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace loongforge {

struct HistogramSummary {
  int64_t count = 0;
  double mean = 0, std = 0, min = 0, max = 0, p50 = 0, p95 = 0, p99 = 0, sum = 0;
};

class Histogram {
 public:
  explicit Histogram(size_t capacity = size_t{1} << 16);
  void Record(double value);
  HistogramSummary Summary() const;
  void Reset();

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  std::vector<double> samples_;
  int64_t count_ = 0;
  double sum_ = 0, sum_sq_ = 0, min_ = 0, max_ = 0;
  std::mt19937_64 rng_{0x5eed};
};

// Monotonic clock in seconds, as a double.
double NowSeconds();

// Records the elapsed milliseconds into `h` when destroyed.
class ScopedTimerMs {
 public:
  explicit ScopedTimerMs(Histogram* h) : h_(h), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimerMs() {
    if (h_) h_->Record(ElapsedMs());
  }
  double ElapsedMs() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  Histogram* h_;
  std::chrono::steady_clock::time_point start_;
};

// Named histograms and counters. Get* return stable pointers owned by the registry.
class MetricsRegistry {
 public:
  Histogram* GetHistogram(const std::string& name);
  std::atomic<int64_t>* GetCounter(const std::string& name);
  std::map<std::string, HistogramSummary> Histograms() const;
  std::map<std::string, int64_t> Counters() const;
  // {"counters": {...}, "histograms": {"name": {"count":..,"p50":..}}}
  std::string ToJson() const;
  // Multi-line human-readable table.
  std::string ToText() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Histogram>> histograms_;
  std::map<std::string, std::unique_ptr<std::atomic<int64_t>>> counters_;
};

std::string SummaryToJson(const HistogramSummary& s);

}  // namespace loongforge
