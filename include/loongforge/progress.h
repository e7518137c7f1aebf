// A progress bar for long CLI work (pack, checkpoint merge/verify, ...).
//
// On a terminal it redraws one line on stderr at most 10 times a second; otherwise (logs, CI) it
// prints a plain line every 10%. Thread-safe: Add() may be called from worker threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace loongforge {

class ProgressBar {
 public:
  // `total` <= 0 means unknown (shows a count and a rate). `enabled` = false prints nothing.
  ProgressBar(std::string label, int64_t total, bool enabled = true);
  ~ProgressBar();  // calls Finish()
  void Add(int64_t n = 1);
  // Optional extra text after the bar (e.g. "12.3 MB/s").
  void SetSuffix(const std::string& suffix);
  void Finish();

 private:
  void Draw(bool final_line);
  std::string label_;
  int64_t total_;
  bool enabled_, tty_;
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  double start_s_, last_draw_s_ = 0;
  int last_decile_ = -1;
  bool finished_ = false;
  std::string suffix_;
};

}  // namespace loongforge
