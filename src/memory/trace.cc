// Alloc/free traces and per-step lifetime tables (include/loongforge/memory.h).
#include <cinttypes>
#include <cstdio>
#include <sstream>
#include <unordered_map>

#include "loongforge/memory.h"

namespace loongforge {
namespace mem {

void Trace::MarkStep(const std::string& signature, int64_t time_ns) {
  TraceEvent e;
  e.kind = TraceEvent::kStep;
  e.time_ns = time_ns;
  e.signature = signature;
  events_.push_back(std::move(e));
}

void Trace::AddAlloc(uint64_t id, int64_t size, StreamId stream, int64_t time_ns) {
  TraceEvent e;
  e.kind = TraceEvent::kAlloc;
  e.id = id;
  e.size = size;
  e.stream = stream;
  e.time_ns = time_ns;
  events_.push_back(std::move(e));
}

void Trace::AddFree(uint64_t id, StreamId stream, int64_t time_ns) {
  TraceEvent e;
  e.kind = TraceEvent::kFree;
  e.id = id;
  e.stream = stream;
  e.time_ns = time_ns;
  events_.push_back(std::move(e));
}

StatusOr<std::vector<LifetimeTable>> Trace::Lifetimes() const {
  std::vector<LifetimeTable> tables;
  LifetimeTable cur;
  // id -> index in cur.allocs for allocations of the current step that are still live.
  std::unordered_map<uint64_t, size_t> live_in_step;
  // ids live at any time (for double-alloc detection across steps).
  std::unordered_map<uint64_t, bool> live_any;
  int step = 0;
  auto flush = [&] {
    for (auto& lt : cur.allocs) {
      if (!lt.freed_in_step) lt.free_seq = cur.num_events;
    }
    if (cur.num_events > 0) tables.push_back(std::move(cur));
    cur = LifetimeTable();
    live_in_step.clear();
  };
  cur.step = 0;
  for (size_t i = 0; i < events_.size(); ++i) {
    const TraceEvent& e = events_[i];
    switch (e.kind) {
      case TraceEvent::kStep:
        flush();
        cur.step = ++step;
        cur.signature = e.signature;
        break;
      case TraceEvent::kAlloc: {
        if (e.size < 0) {
          return InvalidArgumentError("trace event " + std::to_string(i) + ": allocation id " +
                                      std::to_string(e.id) + " has negative size " +
                                      std::to_string(e.size));
        }
        if (live_any.count(e.id)) {
          return InvalidArgumentError("trace event " + std::to_string(i) + ": allocation id " +
                                      std::to_string(e.id) + " allocated again while live");
        }
        live_any[e.id] = true;
        Lifetime lt;
        lt.id = e.id;
        lt.size = e.size;
        lt.stream = e.stream;
        lt.alloc_seq = cur.num_events++;
        lt.alloc_ns = e.time_ns;
        lt.free_ns = -1;
        live_in_step[e.id] = cur.allocs.size();
        cur.allocs.push_back(lt);
        break;
      }
      case TraceEvent::kFree: {
        live_any.erase(e.id);
        auto it = live_in_step.find(e.id);
        int64_t seq = cur.num_events++;
        if (it == live_in_step.end()) {
          ++cur.foreign_frees;
          break;
        }
        Lifetime& lt = cur.allocs[it->second];
        lt.free_seq = seq;
        lt.freed_in_step = true;
        lt.free_ns = e.time_ns;
        live_in_step.erase(it);
        break;
      }
    }
  }
  flush();
  return tables;
}

std::string Trace::ToText() const {
  std::ostringstream os;
  for (const auto& e : events_) {
    switch (e.kind) {
      case TraceEvent::kAlloc:
        os << "a " << e.id << ' ' << e.size << ' ' << e.stream << ' ' << e.time_ns << '\n';
        break;
      case TraceEvent::kFree:
        os << "f " << e.id << ' ' << e.stream << ' ' << e.time_ns << '\n';
        break;
      case TraceEvent::kStep:
        os << "s " << e.time_ns << ' ' << e.signature << '\n';
        break;
    }
  }
  return os.str();
}

StatusOr<Trace> Trace::FromText(const std::string& text) {
  Trace t;
  std::istringstream is(text);
  std::string line;
  int lineno = 0;
  while (std::getline(is, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    char kind = 0;
    ls >> kind;
    bool ok = false;
    if (kind == 'a') {
      uint64_t id, stream;
      int64_t size, ns;
      ok = static_cast<bool>(ls >> id >> size >> stream >> ns);
      if (ok) t.AddAlloc(id, size, stream, ns);
    } else if (kind == 'f') {
      uint64_t id, stream;
      int64_t ns;
      ok = static_cast<bool>(ls >> id >> stream >> ns);
      if (ok) t.AddFree(id, stream, ns);
    } else if (kind == 's') {
      int64_t ns;
      ok = static_cast<bool>(ls >> ns);
      std::string sig;
      if (ok) {
        std::getline(ls, sig);
        if (!sig.empty() && sig[0] == ' ') sig.erase(0, 1);
        t.MarkStep(sig, ns);
      }
    }
    if (!ok) {
      return InvalidArgumentError("trace line " + std::to_string(lineno) + ": cannot parse '" +
                                  line + "'");
    }
  }
  return t;
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%" PRId64 " B", bytes);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
  }
  return buf;
}

}  // namespace mem
}  // namespace loongforge
