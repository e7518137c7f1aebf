#include "loongforge/progress.h"

#include <unistd.h>

#include <cstdio>

#include "loongforge/metrics.h"

namespace loongforge {

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO) == 1),
      start_s_(NowSeconds()) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::SetSuffix(const std::string& suffix) {
  std::lock_guard<std::mutex> lock(mu_);
  suffix_ = suffix;
}

void ProgressBar::Add(int64_t n) {
  done_.fetch_add(n);
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  double now = NowSeconds();
  if (tty_) {
    if (now - last_draw_s_ < 0.1) return;
    last_draw_s_ = now;
    Draw(false);
  } else if (total_ > 0) {
    int decile = static_cast<int>(10 * done_.load() / total_);
    if (decile != last_decile_ && decile < 10) {
      last_decile_ = decile;
      Draw(false);
    }
  }
}

void ProgressBar::Finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  Draw(true);
}

void ProgressBar::Draw(bool final_line) {
  int64_t done = done_.load();
  double elapsed = NowSeconds() - start_s_;
  double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  char buf[512];
  if (total_ > 0) {
    constexpr int kWidth = 30;
    double frac = static_cast<double>(done) / static_cast<double>(total_);
    if (frac > 1) frac = 1;
    int filled = static_cast<int>(frac * kWidth);
    std::string bar(filled, '#');
    bar.append(kWidth - filled, '.');
    double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0;
    std::snprintf(buf, sizeof(buf), "%s [%s] %lld/%lld %5.1f%% %.1f/s eta %.0fs %s", label_.c_str(),
                  bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_),
                  100 * frac, rate, final_line ? 0.0 : eta, suffix_.c_str());
  } else {
    std::snprintf(buf, sizeof(buf), "%s %lld done, %.1f/s %s", label_.c_str(),
                  static_cast<long long>(done), rate, suffix_.c_str());
  }
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", buf, final_line ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", buf);
  }
  std::fflush(stderr);
}

}  // namespace loongforge
