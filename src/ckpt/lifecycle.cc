// CheckpointVault lifecycle: merge, retention, gc, export to safetensors and restore into a
// directory of files. Every file written here is created new next to its target and renamed
// into place (Note [Outputs are created, never followed] in common/file_util.h); gc and
// retention delete only the vault's own files (names.h).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/names.h"
#include "ckpt/vault_impl.h"
#include "common/file_util.h"
#include "loongforge/logging.h"

namespace loongforge {
namespace ckpt {
using internal::CheckHostBytes;
using internal::ChunkDecoder;
using internal::ChunkRec;
using internal::ChunkWhat;
using internal::HashKey;
using internal::Manifest;

namespace {
// The chunk and format line of loongforge.ckpt's structure (Note [The checkpoint structure] in
// python/loongforge/ckpt.py): the only reader of it here is the model-only export.
constexpr char kStructureChunk[] = "__loongforge_meta__";
constexpr char kStructureFormat[] = "loongforge.ckpt.structure/1\n";
constexpr int kMaxStructureDepth = 512;

// One tensor of an export: the whole of manifest tensor `src`, or (a view of shared storage) the
// elements of `src` at `offset` + sum(index[i] * stride[i]) for an index within `shape`.
struct ExportEntry {
  std::string name;
  const internal::TensorRec* src = nullptr;
  bool view = false;
  std::vector<int64_t> shape, stride;
  int64_t offset = 0;
  int64_t nbytes = 0;
};

// Python writes float("nan") and float("inf") as the bare tokens NaN / Infinity (json.dumps with
// allow_nan), which are not JSON: they become null outside strings. Only tensors are read from
// the structure, never those numbers.
std::string NanTokensToNull(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  bool str = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (str) {
      out.push_back(c);
      if (c == '\\' && i + 1 < in.size())
        out.push_back(in[++i]);
      else if (c == '"')
        str = false;
      continue;
    }
    if (c == '"') {
      str = true;
    } else if (in.compare(i, 3, "NaN") == 0) {
      out += "null";
      i += 2;
      continue;
    } else if (in.compare(i, 9, "-Infinity") == 0 || in.compare(i, 8, "Infinity") == 0) {
      out += "null";
      i += in[i] == '-' ? 8 : 7;
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// Collects the tensors of a structure node into `out` as (key path, node), with the key paths
// loongforge.ckpt's encoder gives them. Returns an error message, empty when the node is sound.
std::string CollectLeaves(const nlohmann::json& node, const std::string& path, int depth,
                          std::vector<std::pair<std::string, const nlohmann::json*>>& out) {
  if (depth > kMaxStructureDepth) return "nested deeper than " + std::to_string(kMaxStructureDepth);
  if (!node.is_object()) return {};  // a literal: None, bool, number, string
  const std::string where = path.empty() ? "<root>" : path;
  if (node.size() != 1 && !node.contains("tensor") && !node.contains("view") &&
      !node.contains("ndarray"))
    return where + ": not a structure node";
  if (node.contains("tensor") || node.contains("view") || node.contains("ndarray")) {
    out.emplace_back(path, &node);
    return {};
  }
  const std::string tag = node.begin().key();
  const nlohmann::json& v = node.begin().value();
  if (tag == "dict" || tag == "odict") {
    if (!v.is_array()) return where + ": '" + tag + "' is not a list";
    for (const auto& kv : v) {
      if (!kv.is_array() || kv.size() != 2 || !(kv[0].is_string() || kv[0].is_number_integer()))
        return where + ": a dict item is not [str or int key, node]";
      const std::string k =
          kv[0].is_string() ? kv[0].get<std::string>() : std::to_string(kv[0].get<int64_t>());
      std::string e = CollectLeaves(kv[1], path.empty() ? k : path + "/" + k, depth + 1, out);
      if (!e.empty()) return e;
    }
    return {};
  }
  if (tag == "list" || tag == "tuple") {
    if (!v.is_array()) return where + ": '" + tag + "' is not a list";
    for (size_t i = 0; i < v.size(); ++i) {
      std::string e = CollectLeaves(v[i], path + "/" + std::to_string(i), depth + 1, out);
      if (!e.empty()) return e;
    }
    return {};
  }
  if (tag == "bytes") return {};
  return where + ": unknown structure node '" + tag + "'";
}

// Reads int64 list `key` of a view node (each >= 0).
bool IntList(const nlohmann::json& node, const char* key, std::vector<int64_t>& out) {
  if (!node.contains(key) || !node[key].is_array()) return false;
  out.clear();
  for (const auto& x : node[key]) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0) return false;
    out.push_back(x.get<int64_t>());
  }
  return true;
}

// Copies the elements of `e` (a view) out of its whole storage `base` into `dst`, row-major: a
// row at a time where the last dimension is contiguous (the common case: a tied weight is the
// whole storage), element by element otherwise (a transposed view).
void GatherView(const ExportEntry& e, const uint8_t* base, int esize, uint8_t* dst) {
  const size_t nd = e.shape.size();
  int64_t numel = 1;
  for (int64_t d : e.shape) numel *= d;
  if (numel == 0) return;
  const bool rows = nd > 0 && (e.stride[nd - 1] == 1 || e.shape[nd - 1] == 1);
  const size_t outer = rows ? nd - 1 : nd;  // dimensions walked one index at a time
  const int64_t run = rows ? e.shape[nd - 1] : 1;
  std::vector<int64_t> idx(outer, 0);
  for (int64_t n = 0; n < numel; n += run) {
    int64_t at = e.offset;
    for (size_t d = 0; d < outer; ++d) at += idx[d] * e.stride[d];
    std::memcpy(dst + n * esize, base + at * esize, static_cast<size_t>(run * esize));
    for (size_t d = outer; d-- > 0;) {
      if (++idx[d] < e.shape[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

// Note [Model-only export]
// A vault saved by loongforge.ckpt holds each tensor as a chunk named by its key path
// ("model/encoder.weight"), plus the structure chunk that says where each one sits; tensors
// sharing storage (tied weights) are one chunk of the whole storage and a view node per tensor,
// and a name taken twice gets "#1". So the model's tensors are found through the structure, not by
// chunk name: every tensor or view node whose key path starts with the prefix, named by the rest
// of the path, a view's elements gathered into a tensor of its own (safetensors has no aliasing).
// The structure is parsed as data (JSON); it names chunks, all of which must be in the manifest.
Status CheckpointVault::Impl::ExportSafetensors(int64_t step, const std::string& path,
                                                const ExportOptions& opts,
                                                const ProgressFn& progress) const {
  const std::string ctx = "export checkpoint " + std::to_string(step) + " to " + path;
  // Checked first (and again by rename's target being a file we just made): a device or FIFO at
  // `path` is never replaced, an existing file only when asked to.
  LF_RETURN_IF_ERROR_CTX(loongforge::internal::CheckReplaceableOutput(path, opts.replace), ctx);
  LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
  ChunkDecoder dec(seg_dir_);
  // Decodes every chunk of `t` into `dst` (t.nbytes bytes).
  auto decode_all = [&](const internal::TensorRec& t, uint8_t* dst) -> Status {
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
      const ChunkRec& c = t.chunks[ci];
      LF_RETURN_IF_ERROR(dec.Decode(c, dst, ChunkWhat(step, t.name, ci, c.loc)));
      dst += c.raw;
    }
    return Status::Ok();
  };
  std::vector<ExportEntry> entries;
  if (!opts.model_only) {
    for (const auto& t : m.tensors) {
      ExportEntry e;
      e.name = t.name;
      e.src = &t;
      e.nbytes = t.nbytes;
      entries.push_back(std::move(e));
    }
  } else {
    std::map<std::string, const internal::TensorRec*> by_name;
    for (const auto& t : m.tensors) by_name[t.name] = &t;
    const std::string what = "checkpoint " + std::to_string(step) + " in " + dir_;
    std::vector<std::pair<std::string, const nlohmann::json*>> leaves;
    std::vector<std::string> roots;  // first key path components, for the error of a bad prefix
    nlohmann::json doc;
    auto meta = by_name.find(kStructureChunk);
    if (meta != by_name.end()) {
      std::string raw;
      // nbytes was checked against shape and dtype, not against this machine's memory.
      LF_RETURN_IF_ERROR_CTX(CheckHostBytes(meta->second->nbytes, kStructureChunk), ctx);
      try {
        raw.resize(static_cast<size_t>(meta->second->nbytes));
      } catch (const std::bad_alloc&) {
        return ResourceExhaustedError(ctx + ": cannot allocate " +
                                      std::to_string(meta->second->nbytes) + " bytes for " +
                                      kStructureChunk);
      }
      LF_RETURN_IF_ERROR_CTX(decode_all(*meta->second, reinterpret_cast<uint8_t*>(raw.data())),
                             ctx);
      const size_t fl = sizeof(kStructureFormat) - 1;
      if (raw.compare(0, fl, kStructureFormat) != 0)
        return DataLossError(ctx + ": " + what + ": chunk " + kStructureChunk +
                             " does not start with 'loongforge.ckpt.structure/1'");
      doc = nlohmann::json::parse(NanTokensToNull(raw.substr(fl)), nullptr,
                                  /*allow_exceptions=*/false);
      if (doc.is_discarded() || !doc.is_object() || !doc.contains("root"))
        return DataLossError(ctx + ": " + what + ": chunk " + kStructureChunk +
                             " is not a JSON object with 'root'");
      std::string bad = CollectLeaves(doc["root"], "", 0, leaves);
      if (!bad.empty())
        return DataLossError(ctx + ": " + what + ": chunk " + kStructureChunk + ": " + bad);
    } else {
      for (const auto& t : m.tensors) {
        nlohmann::json n = {{"tensor", t.name}};
        doc["leaves"].push_back(n);
      }
      size_t i = 0;
      for (const auto& t : m.tensors) leaves.emplace_back(t.name, &doc["leaves"][i++]);
    }
    std::set<std::string> names;
    for (const auto& [key_path, node] : leaves) {
      const std::string root = key_path.substr(0, key_path.find('/'));
      if (std::find(roots.begin(), roots.end(), root) == roots.end()) roots.push_back(root);
      if (key_path.size() <= opts.strip_prefix.size() ||
          key_path.compare(0, opts.strip_prefix.size(), opts.strip_prefix) != 0)
        continue;
      ExportEntry e;
      e.name = key_path.substr(opts.strip_prefix.size());
      if (node->contains("ndarray"))
        return InvalidArgumentError(ctx + ": " + key_path +
                                    " is a numpy array; a model-only export writes tensors only "
                                    "(choose a prefix under which there are only tensors)");
      const auto& ref = node->contains("view") ? (*node)["view"] : (*node)["tensor"];
      if (!ref.is_string() || !by_name.count(ref.get<std::string>()) ||
          ref.get<std::string>() == kStructureChunk)
        return DataLossError(ctx + ": " + what + ": " + key_path +
                             " names a chunk the manifest does not hold");
      e.src = by_name[ref.get<std::string>()];
      e.nbytes = e.src->nbytes;
      if (node->contains("view")) {
        e.view = true;
        const nlohmann::json& off = (*node)["offset"];
        if (!IntList(*node, "shape", e.shape) || !IntList(*node, "stride", e.stride) ||
            e.shape.size() != e.stride.size() || !off.is_number_integer() || off.get<int64_t>() < 0)
          return DataLossError(ctx + ": " + what + ": " + key_path +
                               ": a view without non-negative shape, stride and offset");
        e.offset = off.get<int64_t>();
        // Every element must lie inside the storage; sizes are capped so nothing overflows.
        const int esize = DTypeSize(e.src->dtype);
        const int64_t storage_numel = e.src->nbytes / esize;
        constexpr int64_t kCap = int64_t{1} << 40;
        int64_t numel = 1, last = e.offset;
        bool ok = e.offset < kCap;
        for (size_t d = 0; ok && d < e.shape.size(); ++d) {
          ok =
              e.shape[d] < kCap && e.stride[d] < kCap && (numel == 0 || e.shape[d] <= kCap / numel);
          if (ok) numel *= e.shape[d];
          if (ok && e.shape[d] > 0) last += (e.shape[d] - 1) * e.stride[d];
        }
        if (!ok || (numel > 0 && last >= storage_numel))
          return DataLossError(ctx + ": " + what + ": " + key_path + ": a view outside chunk " +
                               e.src->name + " (" + std::to_string(storage_numel) + " elements)");
        e.nbytes = numel * esize;
      } else {
        e.shape = e.src->shape;
      }
      if (!names.insert(e.name).second)
        return InvalidArgumentError(ctx + ": two tensors would both be named '" + e.name +
                                    "' after stripping '" + opts.strip_prefix + "'");
      entries.push_back(std::move(e));
    }
    if (entries.empty()) {
      std::string have;
      for (size_t i = 0; i < roots.size() && i < 8; ++i) have += (i ? ", '" : "'") + roots[i] + "'";
      if (roots.size() > 8) have += ", ...";
      return InvalidArgumentError(
          ctx + ": no tensor's key path starts with the prefix '" + opts.strip_prefix +
          "' (the checkpoint's top-level keys: " + (have.empty() ? "none" : have) + ")");
    }
  }
  nlohmann::ordered_json header;
  if (opts.model_only)
    header["__metadata__"] = {{"format", "pt"}};
  else
    header["__metadata__"] = {{"format", "pt"}, {"loongforge_step", std::to_string(step)}};
  int64_t off = 0;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", DTypeSafetensorsName(e.src->dtype)},
                      {"shape", e.view ? e.shape : e.src->shape},
                      {"data_offsets", {off, off + e.nbytes}}};
    off += e.nbytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  // A new temporary file next to `path`, removed on any failure (TempFile).
  auto created = loongforge::internal::TempFile::CreateNextTo(path);
  if (!created.ok()) return created.status().WithContext(ctx);
  loongforge::internal::TempFile f = std::move(created).value();
  uint8_t len_le[8];
  uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(hl >> (8 * i));
  Status s = f.Write(std::string_view(reinterpret_cast<const char*>(len_le), 8));
  if (s.ok()) s = f.Write(h);
  // Tensors in header order, chunks in order (safetensors data must be contiguous).
  std::vector<uint8_t> scratch(static_cast<size_t>(m.chunk_bytes));
  std::vector<uint8_t> storage, gathered;  // a view's whole storage (kept for the next view)
  const internal::TensorRec* storage_of = nullptr;
  int64_t done = 0;
  for (const auto& e : entries) {
    if (!s.ok()) break;
    if (e.view) {
      if (storage_of != e.src) s = CheckHostBytes(e.src->nbytes, "tensor '" + e.src->name + "'");
      if (s.ok()) s = CheckHostBytes(e.nbytes, "tensor '" + e.name + "'");
      if (!s.ok()) break;
      try {
        if (storage_of != e.src) {
          storage_of = nullptr;
          storage.resize(static_cast<size_t>(e.src->nbytes));
          s = decode_all(*e.src, storage.data());
          if (s.ok()) storage_of = e.src;
        }
        gathered.resize(static_cast<size_t>(e.nbytes));
      } catch (const std::bad_alloc&) {
        s = ResourceExhaustedError("cannot allocate memory for " + e.name);
      }
      if (!s.ok()) break;
      GatherView(e, storage.data(), DTypeSize(e.src->dtype), gathered.data());
      s = f.Write(
          std::string_view(reinterpret_cast<const char*>(gathered.data()), gathered.size()));
      done += e.nbytes;
      if (progress) progress(done);
      continue;
    }
    const auto& t = *e.src;
    for (size_t ci = 0; s.ok() && ci < t.chunks.size(); ++ci) {
      const ChunkRec& c = t.chunks[ci];
      s = dec.Decode(c, scratch.data(), ChunkWhat(step, t.name, ci, c.loc));
      if (s.ok())
        s = f.Write(std::string_view(reinterpret_cast<const char*>(scratch.data()),
                                     static_cast<size_t>(c.raw)));
      done += c.raw;
      if (progress) progress(done);
    }
  }
  if (s.ok()) s = f.Publish(path);
  if (!s.ok()) return s.WithContext(ctx);
  return Status::Ok();
}

namespace {
constexpr char kRestorePrefix[] = ".restore.";

// If `name` in `out_dir` is the private directory of a restore (".restore.<pid>@<host>.XXXXXX")
// whose owner ran on this host and is gone, removes it (its regular files, then itself) and
// returns true. A live owner's directory, another host's, or anything else is left alone.
bool RemoveStaleRestoreDir(const std::string& out_dir, const std::string& name) {
  const size_t plen = sizeof(kRestorePrefix) - 1;
  if (name.compare(0, plen, kRestorePrefix) != 0) return false;
  const size_t at = name.find('@', plen);
  const size_t dot = name.rfind('.');
  if (at == std::string::npos || dot == std::string::npos || dot < at || at == plen) return false;
  if (!loongforge::internal::OwnerIsGone(std::string_view(name).substr(plen, dot - plen)))
    return false;
  const std::string pid = name.substr(plen, at - plen);
  const std::string path = out_dir + "/" + name;
  struct stat sb;
  if (::lstat(path.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) return false;
  auto files = internal::ListDirectory(path);
  if (!files.ok()) return false;
  for (const auto& f : *files) {
    const std::string fp = path + "/" + f;
    if (::lstat(fp.c_str(), &sb) == 0 && S_ISREG(sb.st_mode)) ::unlink(fp.c_str());
  }
  if (::rmdir(path.c_str()) != 0) return false;
  LF_LOG(WARNING) << "removed " << path << ", left by restore process " << pid
                  << " which is no longer running";
  return true;
}
}  // namespace

// Note [Restore into a directory]
// `ckpt restore` writes OUT/<i>.bin per tensor and OUT/tensors.json (the index, written last).
// OUT must be new or empty unless `replace` is given, and then only the files restore itself
// writes are replaced; nothing else in OUT is touched. All files are first written and fsync()ed
// in a new private directory OUT/.restore.<pid>@<host>.XXXXXX (mkdtemp: nobody can have planted
// anything in it; a later restore removes one whose owner is dead on this host), then renamed
// into OUT: rename() replaces a planted symlink, it never writes through one.
// Any failure before the renames (a full disk, an unreadable chunk) removes the private directory
// and, when restore created OUT, OUT itself: nothing partial is left behind.
Status CheckpointVault::Impl::RestoreToDirectory(int64_t step, const std::string& out_dir,
                                                 bool replace, const ProgressFn& progress) const {
  const std::string ctx = "restore checkpoint " + std::to_string(step) + " into " + out_dir;
  LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
  bool created = false;
  struct stat sb;
  // lstat: a symlink at OUT is refused, so restore never writes into a directory it points at.
  if (::lstat(out_dir.c_str(), &sb) == 0) {
    if (S_ISLNK(sb.st_mode))
      return InvalidArgumentError(ctx + ": " + out_dir +
                                  " is a symlink; give the directory itself");
    if (!S_ISDIR(sb.st_mode))
      return AlreadyExistsError(ctx + ": " + out_dir + " exists and is a " +
                                loongforge::internal::FileKindName(sb.st_mode) +
                                ", not a directory");
    auto entries = internal::ListDirectory(out_dir);
    if (!entries.ok()) return entries.status().WithContext(ctx);
    // A restore killed before its renames leaves its private directory; one whose owner is dead
    // on this host is removed so the retry does not see OUT as non-empty.
    std::vector<std::string> kept;
    for (const auto& e : *entries)
      if (!RemoveStaleRestoreDir(out_dir, e)) kept.push_back(e);
    *entries = std::move(kept);
    if (!entries->empty() && !replace)
      return AlreadyExistsError(ctx + ": " + out_dir + " is not empty (" +
                                std::to_string(entries->size()) +
                                " entries); choose a new or empty directory, or ask to replace "
                                "the files restore writes (<i>.bin, tensors.json) with --force");
  } else if (errno == ENOENT) {
    if (::mkdir(out_dir.c_str(), 0755) != 0)
      return ErrnoToStatus(errno, "create directory " + out_dir).WithContext(ctx);
    created = true;
  } else {
    return ErrnoToStatus(errno, "stat " + out_dir).WithContext(ctx);
  }
  std::string tmpl = out_dir + "/" + kRestorePrefix + std::to_string(::getpid()) + "@" +
                     loongforge::internal::HostName() + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    Status s = ErrnoToStatus(errno, "create a private directory in " + out_dir);
    if (created) ::rmdir(out_dir.c_str());
    return s.WithContext(ctx);
  }
  const std::string priv = buf.data();
  std::vector<std::string> files;  // names written into priv, in order
  auto cleanup = [&] {
    for (const auto& f : files) ::unlink((priv + "/" + f).c_str());
    ::rmdir(priv.c_str());
    if (created) ::rmdir(out_dir.c_str());
  };
  auto write_file = [&](const std::string& name, const uint8_t* data, size_t n) -> Status {
    const std::string path = priv + "/" + name;
    LF_ASSIGN_OR_RETURN(int fd, loongforge::internal::OpenNewFile(path));
    files.push_back(name);
    Status s;
    while (n > 0 && s.ok()) {
      ssize_t w = ::write(fd, data, n);
      if (w < 0) {
        if (errno != EINTR) s = ErrnoToStatus(errno, "write " + path);
        continue;
      }
      data += w;
      n -= static_cast<size_t>(w);
    }
    if (s.ok() && ::fsync(fd) != 0) s = ErrnoToStatus(errno, "fsync " + path);
    if (::close(fd) != 0 && s.ok()) s = ErrnoToStatus(errno, "close " + path);
    return s;
  };
  // One tensor at a time: decode it, write it.
  std::vector<uint8_t> data;
  ChunkDecoder dec(seg_dir_);
  nlohmann::json index = nlohmann::json::array();
  int64_t done = 0;
  Status s;
  for (size_t i = 0; s.ok() && i < m.tensors.size(); ++i) {
    const auto& t = m.tensors[i];
    // nbytes was checked against shape and dtype, not against this machine's memory.
    s = CheckHostBytes(t.nbytes, "tensor '" + t.name + "'");
    if (!s.ok()) break;
    try {
      data.resize(static_cast<size_t>(t.nbytes));
    } catch (const std::bad_alloc&) {
      s = ResourceExhaustedError("tensor '" + t.name + "' needs " + std::to_string(t.nbytes) +
                                 " bytes of host memory, which could not be allocated");
      break;
    }
    int64_t off = 0;
    for (size_t ci = 0; s.ok() && ci < t.chunks.size(); ++ci) {
      const ChunkRec& c = t.chunks[ci];
      s = dec.Decode(c, data.data() + off, ChunkWhat(step, t.name, ci, c.loc));
      off += c.raw;
      done += c.raw;
      if (progress) progress(done);
    }
    const std::string file = std::to_string(i) + ".bin";
    if (s.ok()) s = write_file(file, data.data(), data.size());
    index.push_back(
        {{"name", t.name}, {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"file", file}});
  }
  if (s.ok()) {
    const std::string body = index.dump(1) + "\n";
    s = write_file("tensors.json", reinterpret_cast<const uint8_t*>(body.data()), body.size());
  }
  if (s.ok()) s = loongforge::internal::SyncDir(priv);
  if (!s.ok()) {
    cleanup();
    return s.WithContext(ctx);
  }
  // Publish: the tensor files, then the index.
  for (const auto& f : files) {
    if (::rename((priv + "/" + f).c_str(), (out_dir + "/" + f).c_str()) != 0) {
      s = ErrnoToStatus(errno, "rename " + priv + "/" + f + " to " + out_dir + "/" + f);
      break;
    }
  }
  if (!s.ok()) {
    cleanup();  // tensor files already renamed are complete; the index (last) is not published
    return s.WithContext(ctx);
  }
  ::rmdir(priv.c_str());
  return loongforge::internal::SyncDir(out_dir).WithContext(ctx);
}

Status CheckpointVault::Impl::Merge(int64_t step, const ProgressFn& progress) {
  std::lock_guard<std::mutex> api(api_mu_);
  if (opts_.read_only) return FailedPreconditionError("vault " + dir_ + " is open read-only");
  LF_RETURN_IF_ERROR(WaitLocked());
  std::lock_guard<std::mutex> wl(writer_mu_);
  LF_ASSIGN_OR_RETURN(Manifest m, LoadManifest(step));
  const std::string seg_name = internal::NewSegmentName(step, "m");
  const std::string seg_path = seg_dir_ + "/" + seg_name;
  LF_ASSIGN_OR_RETURN(auto file, opts_.env->NewWritableFile(seg_path));
  ChunkDecoder dec(seg_dir_);
  std::vector<uint8_t> raw(static_cast<size_t>(m.chunk_bytes));
  std::unordered_map<Hash128, ChunkRec, HashKey> done_map;
  int64_t off = 0, done_bytes = 0;
  Status s;
  for (auto& t : m.tensors) {
    for (size_t ci = 0; s.ok() && ci < t.chunks.size(); ++ci) {
      ChunkRec& c = t.chunks[ci];
      done_bytes += c.raw;
      if (auto it = done_map.find(c.hash); it != done_map.end()) {
        c = it->second;
        continue;
      }
      s = dec.Decode(c, raw.data(), ChunkWhat(step, t.name, ci, c.loc));
      if (!s.ok()) break;
      ChunkRec n;
      n.hash = c.hash;
      n.raw = c.raw;
      const internal::ChunkEncoder::Payload payload = encoder_->Encode(raw.data(), &n);
      s = file->Append(payload.data, static_cast<size_t>(payload.len));
      n.loc = {seg_name, off, payload.len};
      off += payload.len;
      done_map.emplace(n.hash, n);
      c = n;
      if (progress) progress(done_bytes);
    }
  }
  if (s.ok() && opts_.fsync) s = file->Sync();
  Status cs = file->Close();
  if (s.ok()) s = cs;
  if (s.ok() && opts_.fsync) s = opts_.env->SyncDir(seg_dir_);
  m.parent = -1;
  if (s.ok()) s = CommitManifest(m);  // atomically replaces the old manifest of `step`
  if (!s.ok()) {
    opts_.env->Remove(seg_path).IgnoreError();
    return s.WithContext("merge checkpoint " + std::to_string(step) + " (it is unchanged)");
  }
  if (step == latest_committed_) IndexFrom(m, /*seed_known=*/false);
  return GcLocked(false).status();
}

Status CheckpointVault::Impl::ApplyRetention() {
  std::lock_guard<std::mutex> api(api_mu_);
  if (opts_.read_only) return FailedPreconditionError("vault " + dir_ + " is open read-only");
  LF_RETURN_IF_ERROR(WaitLocked());
  std::lock_guard<std::mutex> wl(writer_mu_);
  return RetentionLocked();
}

Status CheckpointVault::Impl::RetentionLocked() {
  if (opts_.keep_last <= 0) return Status::Ok();
  LF_ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
  if (steps.empty()) return Status::Ok();
  std::set<int64_t> keep;
  for (size_t i = steps.size() > static_cast<size_t>(opts_.keep_last)
                      ? steps.size() - static_cast<size_t>(opts_.keep_last)
                      : 0;
       i < steps.size(); ++i)
    keep.insert(steps[i]);
  keep.insert(steps.back());
  bool removed = false;
  for (int64_t s : steps) {
    if (keep.count(s) || (opts_.keep_every > 0 && s % opts_.keep_every == 0)) continue;
    LF_RETURN_IF_ERROR(opts_.env->Remove(man_dir_ + "/" + internal::ManifestName(s)));
    removed = true;
  }
  if (removed && opts_.fsync) LF_RETURN_IF_ERROR(opts_.env->SyncDir(man_dir_));
  if (removed) return GcLocked(false).status();
  return Status::Ok();
}

StatusOr<GcStats> CheckpointVault::Impl::Gc(bool dry_run) {
  std::lock_guard<std::mutex> api(api_mu_);
  if (opts_.read_only) return FailedPreconditionError("vault " + dir_ + " is open read-only");
  LF_RETURN_IF_ERROR(WaitLocked());
  std::lock_guard<std::mutex> wl(writer_mu_);
  return GcLocked(dry_run);
}

// Runs with writer_mu_ held, so no segment is being written. A manifest that cannot be read
// stops gc: nothing is deleted unless every manifest proves it unreferenced. Only regular files
// named like the vault's own segments and temporary manifests (names.h) are deleted; anything
// else (a user's notes, dotfiles, symlinks, folders) is left alone and listed in `skipped`.
StatusOr<GcStats> CheckpointVault::Impl::GcLocked(bool dry_run) {
  LF_ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
  std::set<std::string> live;
  for (int64_t s : steps) {
    auto m = LoadManifest(s);
    if (!m.ok()) return m.status().WithContext("gc stopped, nothing deleted");
    for (auto& seg : m->Segments()) live.insert(seg);
  }
  GcStats st;
  LF_ASSIGN_OR_RETURN(auto seg_names, internal::ListDirectory(seg_dir_));
  for (const std::string& name : seg_names) {
    const std::string path = seg_dir_ + "/" + name;
    struct stat sb;
    if (::lstat(path.c_str(), &sb) != 0) {
      if (errno == ENOENT) continue;
      return ErrnoToStatus(errno, "stat " + path).WithContext("gc");
    }
    if (!S_ISREG(sb.st_mode) || !internal::IsSegmentName(name)) {
      st.skipped.push_back(path);
      continue;
    }
    const int64_t size = static_cast<int64_t>(sb.st_size);
    if (live.count(name)) {
      ++st.segments_live;
      st.bytes_live += size;
      continue;
    }
    ++st.segments_deleted;
    st.bytes_freed += size;
    if (!dry_run) LF_RETURN_IF_ERROR(opts_.env->Remove(path));
  }
  LF_ASSIGN_OR_RETURN(auto man_names, internal::ListDirectory(man_dir_));
  for (const std::string& name : man_names) {
    if (!internal::IsManifestTempName(name)) continue;
    const std::string path = man_dir_ + "/" + name;
    struct stat sb;
    if (::lstat(path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (!dry_run) LF_RETURN_IF_ERROR(opts_.env->Remove(path));
  }
  if (!dry_run && st.segments_deleted > 0 && opts_.fsync)
    LF_RETURN_IF_ERROR(opts_.env->SyncDir(seg_dir_));
  if (!st.skipped.empty()) {
    std::string list;
    for (const auto& p : st.skipped) list += (list.empty() ? "" : ", ") + p;
    LF_LOG(WARNING) << "checkpoint gc left " << st.skipped.size()
                    << " entries alone that are not segment files of the vault: " << list;
  }
  return st;
}

}  // namespace ckpt
}  // namespace loongforge
