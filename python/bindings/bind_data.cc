// Bindings of DataFusion's CPU loader: _C.DataLoader yields dicts of DLPack capsules.
#include <pybind11/stl.h>

#include "bindings.h"
#include "dlpack_capsule.h"
#include "loongforge/loader.h"

namespace loongforge {
namespace {

py::dict SummaryDict(const HistogramSummary& s) {
  py::dict d;
  d["count"] = s.count;
  d["mean"] = s.mean;
  d["std"] = s.std;
  d["min"] = s.min;
  d["max"] = s.max;
  d["p50"] = s.p50;
  d["p95"] = s.p95;
  d["p99"] = s.p99;
  d["sum"] = s.sum;
  return d;
}

LoaderOptions OptionsFromKwargs(const std::string& db, const py::kwargs& kw) {
  LoaderOptions o;
  o.db_path = db;
  for (auto item : kw) {
    std::string k = py::str(item.first);
    py::handle v = item.second;
    if (k == "batch_size")
      o.batch_size = v.cast<int>();
    else if (k == "image_size")
      o.image_size = v.cast<int>();
    else if (k == "crop_fraction")
      o.crop_fraction = v.cast<float>();
    else if (k == "train")
      o.train = v.cast<bool>();
    else if (k == "color_jitter")
      o.color_jitter = v.cast<bool>();
    else if (k == "mean")
      o.mean = v.cast<std::array<float, 3>>();
    else if (k == "std")
      o.std = v.cast<std::array<float, 3>>();
    else if (k == "dct_scaling")
      o.dct_scaling = v.cast<bool>();
    else if (k == "normalize_state")
      o.normalize_state = v.cast<bool>();
    else if (k == "seed")
      o.seed = v.cast<uint64_t>();
    else if (k == "rank")
      o.rank = v.cast<int>();
    else if (k == "world_size")
      o.world_size = v.cast<int>();
    else if (k == "shuffle")
      o.shuffle = v.cast<bool>();
    else if (k == "drop_last")
      o.drop_last = v.cast<bool>();
    else if (k == "threads")
      o.threads = v.cast<int>();
    else if (k == "prefetch")
      o.prefetch = v.cast<int>();
    else if (k == "token_pad")
      o.token_pad = v.cast<int>();
    else if (k == "pin_memory")
      o.pin_memory = v.cast<bool>();
    else if (k == "timeout_ms")
      o.timeout_ms = v.cast<int64_t>();
    else if (k == "on_corrupt") {
      std::string p = v.cast<std::string>();
      if (p == "skip")
        o.on_corrupt = CorruptPolicy::kSkip;
      else if (p == "error")
        o.on_corrupt = CorruptPolicy::kError;
      else
        ThrowStatus(InvalidArgumentError("on_corrupt must be 'skip' or 'error', got '" + p + "'"));
    } else {
      ThrowStatus(InvalidArgumentError("DataLoader: unknown option '" + k + "'"));
    }
  }
  return o;
}

py::dict BatchDict(std::shared_ptr<Batch> b) {
  using dlpack::MakeCapsule;
  std::shared_ptr<const void> owner = b;
  const int64_t n = b->size;
  py::dict d;
  d["images"] =
      MakeCapsule(owner, b->images, {n, b->cameras, 3, b->height, b->width}, dlpack::kFloat32);
  d["tokens"] = MakeCapsule(owner, b->tokens, {n, b->tokens_len}, dlpack::kInt64);
  d["attention_mask"] =
      MakeCapsule(owner, b->attention_mask, {n, b->tokens_len},
                  dlpack::kUInt8);  // bool view in Python (torch 1.13 lacks DLPack bool)
  d["state"] = MakeCapsule(owner, b->state, {n, b->state_dim}, dlpack::kFloat32);
  d["action"] = MakeCapsule(owner, b->action, {n, b->horizon, b->action_dim}, dlpack::kFloat32);
  d["action_mask"] =
      MakeCapsule(owner, b->action_mask, {n, b->horizon},
                  dlpack::kUInt8);  // bool view in Python (torch 1.13 lacks DLPack bool)
  d["sample_index"] = MakeCapsule(owner, b->sample_index, {n}, dlpack::kInt64);
  d["epoch"] = b->epoch;
  d["index"] = b->index;
  d["pinned"] = b->pinned;
  d["latency_ms"] = b->latency_ms;
  return d;
}

void BindData(py::module_& m) {
  py::class_<RecordWriter>(m, "RecordWriter",
                           "Writes a dataset record by record; published atomically by commit().")
      .def(py::init([](const std::string& path, bool overwrite) {
             return ValueOrThrow(RecordWriter::Create(path, overwrite));
           }),
           py::arg("path"), py::arg("overwrite") = false)
      .def("put", [](RecordWriter& w, const std::string& key, py::bytes value) {
             std::string_view v = value;
             ThrowIfError(w.Put(key, v));
           }, py::arg("key"), py::arg("value"))
      .def("commit", [](RecordWriter& w, const std::string& schema_json) {
             Schema s = ValueOrThrow(Schema::FromJson(schema_json, "schema"));
             py::gil_scoped_release nogil;
             ThrowIfError(w.Commit(s));
           }, py::arg("schema_json"), "Writes the schema record, syncs, and publishes the DB.");

  py::class_<RecordReader>(m, "RecordReader",
                           "Read-only access to a packed dataset's raw records (copies into bytes).")
      .def(py::init([](const std::string& path) { return ValueOrThrow(RecordReader::Open(path)); }),
           py::arg("path"))
      .def("get", [](const RecordReader& r, const std::string& key) {
             auto txn = ValueOrThrow(r.Begin());
             std::string_view v = ValueOrThrow(txn.Get(key));
             return py::bytes(v.data(), v.size());
           }, py::arg("key"), "The record's bytes; FileNotFoundError naming the key if absent.")
      .def("keys", [](const RecordReader& r) { return ValueOrThrow(r.Keys()); })
      .def_property_readonly("schema_json", [](const RecordReader& r) { return r.schema().ToJson(); })
      .def_property_readonly("size_bytes", &RecordReader::size_bytes);

  py::class_<DataLoader>(m, "DataLoader", "DataFusion CPU loader (use loongforge.DataFusionLoader)")
      .def(py::init([](const std::string& db, py::kwargs kw) {
             LoaderOptions o = OptionsFromKwargs(db, kw);
             StatusOr<std::unique_ptr<DataLoader>> dl = [&] {
               py::gil_scoped_release nogil;
               return DataLoader::Create(o);
             }();
             return ValueOrThrow(std::move(dl));
           }),
           py::arg("db"))
      .def(
          "start",
          [](DataLoader& d, int64_t epoch, int64_t start_batch) {
            ThrowIfError(d.Start(epoch, start_batch));
          },
          py::arg("epoch"), py::arg("start_batch") = 0)
      .def(
          "next",
          [](DataLoader& d) -> py::object {
            StatusOr<std::shared_ptr<Batch>> b = [&] {
              py::gil_scoped_release nogil;
              return d.Next();
            }();
            if (!b.ok() && b.status().code() == StatusCode::kOutOfRange) return py::none();
            return BatchDict(ValueOrThrow(std::move(b)));
          },
          "Next batch as a dict of DLPack capsules, or None at the end of the epoch.")
      .def("stop",
           [](DataLoader& d) {
             py::gil_scoped_release nogil;
             d.Stop();
           })
      .def_property_readonly("batches_per_epoch", &DataLoader::batches_per_epoch)
      .def_property_readonly("epoch", &DataLoader::epoch)
      .def_property_readonly("next_batch", &DataLoader::next_batch)
      .def_property_readonly("corrupt_skipped", &DataLoader::corrupt_skipped)
      .def_property_readonly("schema_json", [](DataLoader& d) { return d.schema().ToJson(); })
      .def("metrics", [](DataLoader& d) {
        py::dict out, hist, cnt;
        for (const auto& [k, s] : d.metrics().Histograms()) hist[py::str(k)] = SummaryDict(s);
        for (const auto& [k, v] : d.metrics().Counters()) cnt[py::str(k)] = v;
        out["histograms"] = hist;
        out["counters"] = cnt;
        return out;
      });
}

}  // namespace
LF_REGISTER_BINDINGS(data, BindData);
}  // namespace loongforge
