#include "loongforge/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace loongforge {

Histogram::Histogram(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

void Histogram::Record(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  if (count_ == 0) {
    min_ = max_ = v;
  } else {
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
  }
  ++count_;
  sum_ += v;
  sum_sq_ += v * v;
  if (samples_.size() < capacity_) {
    samples_.push_back(v);
  } else {
    // Reservoir sampling (Vitter's algorithm R): each sample is kept with probability cap/count.
    std::uniform_int_distribution<int64_t> dist(0, count_ - 1);
    int64_t j = dist(rng_);
    if (j < static_cast<int64_t>(capacity_)) samples_[static_cast<size_t>(j)] = v;
  }
}

static double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  double pos = q * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return sorted[lo] * (1 - frac) + sorted[hi] * frac;
}

HistogramSummary Histogram::Summary() const {
  std::vector<double> s;
  HistogramSummary out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = samples_;
    out.count = count_;
    out.sum = sum_;
    out.min = min_;
    out.max = max_;
    if (count_ > 0) {
      out.mean = sum_ / static_cast<double>(count_);
      double var = sum_sq_ / static_cast<double>(count_) - out.mean * out.mean;
      out.std = var > 0 ? std::sqrt(var) : 0;
    }
  }
  std::sort(s.begin(), s.end());
  out.p50 = Percentile(s, 0.50);
  out.p95 = Percentile(s, 0.95);
  out.p99 = Percentile(s, 0.99);
  return out;
}

void Histogram::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  samples_.clear();
  count_ = 0;
  sum_ = sum_sq_ = min_ = max_ = 0;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = histograms_[name];
  if (!slot) slot = std::make_unique<Histogram>();
  return slot.get();
}

std::atomic<int64_t>* MetricsRegistry::GetCounter(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = counters_[name];
  if (!slot) slot = std::make_unique<std::atomic<int64_t>>(0);
  return slot.get();
}

std::map<std::string, HistogramSummary> MetricsRegistry::Histograms() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, HistogramSummary> out;
  for (const auto& [k, h] : histograms_) out[k] = h->Summary();
  return out;
}

std::map<std::string, int64_t> MetricsRegistry::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int64_t> out;
  for (const auto& [k, c] : counters_) out[k] = c->load();
  return out;
}

std::string SummaryToJson(const HistogramSummary& s) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\"count\": %lld, \"mean\": %.6g, \"std\": %.6g, \"min\": %.6g, \"max\": %.6g, "
                "\"p50\": %.6g, \"p95\": %.6g, \"p99\": %.6g, \"sum\": %.6g}",
                static_cast<long long>(s.count), s.mean, s.std, s.min, s.max, s.p50, s.p95, s.p99,
                s.sum);
  return buf;
}

std::string MetricsRegistry::ToJson() const {
  std::ostringstream os;
  os << "{\"counters\": {";
  bool first = true;
  for (const auto& [k, v] : Counters()) {
    os << (first ? "" : ", ") << "\"" << k << "\": " << v;
    first = false;
  }
  os << "}, \"histograms\": {";
  first = true;
  for (const auto& [k, s] : Histograms()) {
    os << (first ? "" : ", ") << "\"" << k << "\": " << SummaryToJson(s);
    first = false;
  }
  os << "}}";
  return os.str();
}

std::string MetricsRegistry::ToText() const {
  std::ostringstream os;
  char buf[256];
  for (const auto& [k, s] : Histograms()) {
    std::snprintf(buf, sizeof(buf),
                  "  %-24s n=%-8lld p50=%-10.4g p95=%-10.4g p99=%-10.4g std=%.4g\n", k.c_str(),
                  static_cast<long long>(s.count), s.p50, s.p95, s.p99, s.std);
    os << buf;
  }
  for (const auto& [k, v] : Counters()) {
    std::snprintf(buf, sizeof(buf), "  %-24s %lld\n", k.c_str(), static_cast<long long>(v));
    os << buf;
  }
  return os.str();
}

}  // namespace loongforge
