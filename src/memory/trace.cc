// Alloc/free traces and per-step lifetime tables (include/loongforge/memory.h).
#include <zstd.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
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
  // Allocations that outlived their step: id -> (table index, index in its allocs).
  std::unordered_map<uint64_t, std::pair<size_t, size_t>> outliving;
  int step = 0;
  auto flush = [&] {
    for (size_t a = 0; a < cur.allocs.size(); ++a) {
      Lifetime& lt = cur.allocs[a];
      if (lt.freed_in_step) continue;
      lt.free_seq = cur.num_events;
      if (cur.num_events > 0) outliving[lt.id] = {tables.size(), a};
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
          cur.last_foreign_free_seq = seq;
          auto o = outliving.find(e.id);
          if (o != outliving.end()) {  // freed after the step that follows its own: persistent
            if (o->second.first + 1 < tables.size())
              tables[o->second.first].allocs[o->second.second].persistent = true;
            outliving.erase(o);
          }
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
  // Never freed, and a later step was recorded: live past the end of the next step.
  for (const auto& [id, at] : outliving) {
    if (at.first + 1 < tables.size()) tables[at.first].allocs[at.second].persistent = true;
  }
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

namespace {

constexpr uint32_t kZstdMagic = 0xFD2FB528u;  // little-endian, first four bytes of a frame

bool IsZstd(const std::string& bytes) {
  if (bytes.size() < 4) return false;
  uint32_t m = static_cast<uint8_t>(bytes[0]) | static_cast<uint8_t>(bytes[1]) << 8 |
               static_cast<uint8_t>(bytes[2]) << 16 |
               static_cast<uint32_t>(static_cast<uint8_t>(bytes[3])) << 24;
  return m == kZstdMagic;
}

// Streaming decompression: the frame may not record its content size.
StatusOr<std::string> Unzstd(const std::string& in, const std::string& path) {
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!dctx) return InternalError(path + ": cannot create a zstd context");
  std::string out;
  std::vector<char> buf(ZSTD_DStreamOutSize());
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  size_t last = 0;
  while (ib.pos < ib.size) {
    ZSTD_outBuffer ob{buf.data(), buf.size(), 0};
    last = ZSTD_decompressStream(dctx.get(), &ob, &ib);
    if (ZSTD_isError(last)) {
      return DataLossError(path + ": corrupt zstd data: " + ZSTD_getErrorName(last));
    }
    out.append(buf.data(), ob.pos);
  }
  // Flush what the context still holds; last != 0 after the input ends means a truncated frame.
  while (last != 0) {
    ZSTD_outBuffer ob{buf.data(), buf.size(), 0};
    last = ZSTD_decompressStream(dctx.get(), &ob, &ib);
    if (ZSTD_isError(last)) {
      return DataLossError(path + ": corrupt zstd data: " + ZSTD_getErrorName(last));
    }
    if (ob.pos == 0 && last != 0) return DataLossError(path + ": truncated zstd frame");
    out.append(buf.data(), ob.pos);
  }
  return out;
}

}  // namespace

StatusOr<Trace> Trace::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open trace");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return InternalError(path + ": read failed");
  std::string bytes = ss.str();
  if (IsZstd(bytes)) {
    LF_ASSIGN_OR_RETURN(bytes, Unzstd(bytes, path));
  }
  StatusOr<Trace> t = FromText(bytes);
  if (!t.ok()) return t.status().WithContext(path);
  return t;
}

Status Trace::Save(const std::string& path, bool compress) const {
  std::string text = ToText();
  std::string data;
  if (compress) {
    data.resize(ZSTD_compressBound(text.size()));
    size_t z = ZSTD_compress(data.data(), data.size(), text.data(), text.size(), 19);
    if (ZSTD_isError(z)) return InternalError(path + ": zstd: " + ZSTD_getErrorName(z));
    data.resize(z);
  } else {
    data = std::move(text);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return InternalError(tmp + ": cannot open for writing");
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) return InternalError(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return InternalError(path + ": rename from " + tmp + " failed");
  }
  return Status::Ok();
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
