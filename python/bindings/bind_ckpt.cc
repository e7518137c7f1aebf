// Bindings of CheckpointVault (loongforge._C.CheckpointVault). Tensors cross as (name, tensor)
// pairs, converted by the one converter (tensor_convert.h) from torch tensors or any DLPack
// producer, so nothing is copied on the Python side; CUDA tensors carry torch's current stream of
// their device. The GIL is released around save, restore and lifecycle calls.
#include <pybind11/stl.h>

#include "bindings.h"
#include "loongforge/ckpt.h"
#include "option_table.h"
#include "tensor_convert.h"

namespace loongforge {
namespace {
using ckpt::CheckpointVault;

py::dict StatsDict(const ckpt::SaveStats& s) {
  py::dict d;
  d["step"] = s.step;
  d["blocking_s"] = s.blocking_s;
  d["wait_s"] = s.wait_s;
  d["durable_s"] = s.durable_s;
  d["prepare_s"] = s.prepare_s;
  d["snapshot_s"] = s.snapshot_s;
  d["stage_s"] = s.stage_s;
  d["hash_s"] = s.hash_s;
  d["copy_s"] = s.copy_s;
  d["staging_allocated"] = s.staging_allocated;
  d["write_s"] = s.write_s;
  d["bytes_total"] = s.bytes_total;
  d["bytes_copied"] = s.bytes_copied;
  d["bytes_written"] = s.bytes_written;
  d["chunks_total"] = s.chunks_total;
  d["chunks_written"] = s.chunks_written;
  d["chunks_skipped"] = s.chunks_skipped;
  d["chunks_compressed"] = s.chunks_compressed;
  d["chunks_delta"] = s.chunks_delta;
  d["snapshot_path"] = s.snapshot_path;
  d["snapshot_reason"] = s.snapshot_reason;
  d["staged_hash_s"] = s.staged_hash_s;
  d["d2h_s"] = s.d2h_s;
  d["bytes_d2h"] = s.bytes_d2h;
  d["writer"] = s.writer;
  d["writer_reason"] = s.writer_reason;
  d["chunks_cufile"] = s.chunks_cufile;
  d["bytes_cufile"] = s.bytes_cufile;
  d["cufile_s"] = s.cufile_s;
  return d;
}

// (name, tensor) pairs as TensorRefs; `held` keeps each tensor's memory alive.
std::vector<ckpt::TensorRef> ToRefs(const py::list& tensors, std::vector<PyTensor>* held) {
  std::vector<ckpt::TensorRef> refs;
  held->reserve(tensors.size());
  refs.reserve(tensors.size());
  CurrentStreams streams;  // one current-stream lookup per device for the whole state
  for (const auto& item : tensors) {
    auto t = item.cast<py::tuple>();
    if (t.size() != 2) throw py::value_error("save: each tensor is (name, tensor)");
    std::string name = t[0].cast<std::string>();
    held->push_back(ToTensorViewOrThrow(t[1], name, &streams));
    refs.push_back({std::move(name), held->back().view});
  }
  return refs;
}

// VaultOptions by Python name (Note [Option tables]); `env` is C++ only.
const std::vector<OptionField<ckpt::VaultOptions>>& VaultFields() {
  using O = ckpt::VaultOptions;
  static const char* const w = "CheckpointVault";
  static const std::vector<OptionField<O>> fields = {
      Plain(w, "chunk_bytes", &O::chunk_bytes),
      Plain(w, "compress", &O::compress),
      Plain(w, "compress_level", &O::compress_level),
      Plain(w, "compress_max_ratio", &O::compress_max_ratio),
      Plain(w, "xor_delta", &O::xor_delta),
      Plain(w, "keep_last", &O::keep_last),
      Plain(w, "keep_every", &O::keep_every),
      Plain(w, "max_inflight", &O::max_inflight),
      Plain(w, "fsync", &O::fsync),
      Plain(w, "read_only", &O::read_only),
      Plain(w, "io_threads", &O::io_threads),
      Plain(w, "wait_timeout_ms", &O::wait_timeout_ms),
      Choice(w, "device_staging", &O::device_staging,
             {{"auto", ckpt::DeviceStaging::kAuto},
              {"on", ckpt::DeviceStaging::kOn},
              {"off", ckpt::DeviceStaging::kOff}}),
      Plain(w, "device_staging_max_bytes", &O::device_staging_max_bytes),
      Plain(w, "d2h_buffer_bytes", &O::d2h_buffer_bytes),
      Choice(w, "writer", &O::writer,
             {{"auto", ckpt::Writer::kAuto},
              {"posix", ckpt::Writer::kPosix},
              {"cufile", ckpt::Writer::kCufile}}),
  };
  return fields;
}

void BindCkpt(py::module_& m) {
  m.def(
      "vault_options", [] { return OptionDefaults(VaultFields()); },
      "Every CheckpointVault option and its default (Note [Option tables]).");
  py::class_<CheckpointVault>(m, "CheckpointVault",
                              "Incremental, asynchronous, crash-consistent checkpoints (C++ core).")
      .def(py::init([](const std::string& dir, const py::kwargs& kw) {
             ckpt::VaultOptions o;
             ApplyOptions(VaultFields(), "CheckpointVault", kw, &o);
             return ValueOrThrowWithoutGil([&] { return CheckpointVault::Open(dir, o); });
           }),
           py::arg("dir"),
           "Opens or creates the vault at `dir`; keyword arguments are VaultOptions fields "
           "(vault_options() lists them with their defaults).")
      .def(
          "save",
          [](CheckpointVault& v, int64_t step, const py::list& tensors) {
            std::vector<PyTensor> held;  // keeps each tensor's memory alive through Save()
            std::vector<ckpt::TensorRef> refs = ToRefs(tensors, &held);
            ThrowIfErrorWithoutGil([&] { return v.Save(step, refs); });
          },
          py::arg("step"), py::arg("tensors"),
          "Snapshots the (name, tensor) pairs (contiguous; host or CUDA memory) and queues the "
          "write. A CUDA tensor's snapshot is ordered after the work queued so far on torch's "
          "current stream of its device.")
      .def(
          "try_save",
          [](CheckpointVault& v, int64_t step, const py::list& tensors) {
            std::vector<PyTensor> held;
            std::vector<ckpt::TensorRef> refs = ToRefs(tensors, &held);
            return ValueOrThrowWithoutGil([&] { return v.TrySave(step, refs); });
          },
          py::arg("step"), py::arg("tensors"),
          "save() that never waits for the writer: False (nothing snapshotted) while "
          "max_inflight saves are pending.")
      .def(
          "reserve_device_staging",
          [](CheckpointVault& v, const py::list& tensors) {
            std::vector<PyTensor> held;
            std::vector<ckpt::TensorRef> refs = ToRefs(tensors, &held);
            std::string why;
            const int64_t bytes =
                ValueOrThrowWithoutGil([&] { return v.ReserveDeviceStaging(refs, &why); });
            return py::make_tuple(bytes, why);
          },
          py::arg("tensors"),
          "Allocates ahead the device staging a save of these tensors takes: (bytes allocated, "
          "why nothing was when 0).")
      .def("busy", &CheckpointVault::Busy,
           "True while max_inflight saves are pending (save() would wait).")
      .def(
          "take_committed_stats",
          [](CheckpointVault& v) { return ListOf(v.TakeCommittedStats(), StatsDict); },
          "Stats of the saves committed since the previous call, oldest first.")
      .def("wait", [](CheckpointVault& v) { ThrowIfErrorWithoutGil([&] { return v.Wait(); }); })
      .def("close", [](CheckpointVault& v) { ThrowIfErrorWithoutGil([&] { return v.Close(); }); })
      .def("list", [](const CheckpointVault& v) { return ValueOrThrow(v.List()); })
      .def("latest", [](const CheckpointVault& v) { return v.Latest(); })
      .def("describe",
           [](const CheckpointVault& v, int64_t step) {
             return ListOf(ValueOrThrow(v.Describe(step)), [](const auto& i) {
               py::dict d;
               d["name"] = i.name;
               d["dtype"] = i.dtype;
               d["shape"] = i.shape;
               d["nbytes"] = i.nbytes;
               d["num_chunks"] = i.num_chunks;
               return d;
             });
           })
      .def("summary",
           [](const CheckpointVault& v, int64_t step) {
             auto s = ValueOrThrow(v.Summary(step));
             py::dict d;
             d["step"] = s.step;
             d["parent"] = s.parent;
             d["num_tensors"] = s.num_tensors;
             d["bytes_total"] = s.bytes_total;
             d["bytes_own"] = s.bytes_own;
             d["num_segments"] = s.num_segments;
             d["created_unix"] = s.created_unix;
             return d;
           })
      .def(
          "restore_into",
          [](const CheckpointVault& v, int64_t step, const py::list& targets) {
            std::vector<PyTensor> held;  // keeps each target's memory alive through RestoreInto()
            std::map<std::string, ckpt::RestoreTarget> tg;
            held.reserve(targets.size());
            for (const auto& item : targets) {
              auto t = item.cast<py::tuple>();
              if (t.size() != 2)
                throw py::value_error("restore_into: each target is (name, tensor)");
              std::string name = t[0].cast<std::string>();
              held.push_back(ToTensorViewOrThrow(t[1], name));
              tg[name] = ValueOrThrow(ckpt::RestoreTarget::FromView(name, held.back().view));
            }
            ThrowIfErrorWithoutGil([&] { return v.RestoreInto(step, tg); });
          },
          py::arg("step"), py::arg("targets"),
          "Restores into (name, tensor) pairs: contiguous, writable, of the stored size.")
      .def("verify", [](const CheckpointVault& v,
                        int64_t step) { ThrowIfErrorWithoutGil([&] { return v.Verify(step); }); })
      .def(
          "export_safetensors",
          [](const CheckpointVault& v, int64_t step, const std::string& path, bool model_only,
             const std::string& strip_prefix) {
            ckpt::ExportOptions o;
            o.model_only = model_only;
            o.strip_prefix = strip_prefix;
            ThrowIfErrorWithoutGil([&] { return v.ExportSafetensors(step, path, o); });
          },
          py::arg("step"), py::arg("path"), py::arg("model_only") = false,
          py::arg("strip_prefix") = "model/")
      .def("merge", [](CheckpointVault& v,
                       int64_t step) { ThrowIfErrorWithoutGil([&] { return v.Merge(step); }); })
      .def(
          "gc",
          [](CheckpointVault& v, bool dry_run) {
            ckpt::GcStats s = ValueOrThrowWithoutGil([&] { return v.Gc(dry_run); });
            py::dict d;
            d["segments_deleted"] = s.segments_deleted;
            d["bytes_freed"] = s.bytes_freed;
            d["segments_live"] = s.segments_live;
            d["bytes_live"] = s.bytes_live;
            return d;
          },
          py::arg("dry_run") = false)
      .def("apply_retention",
           [](CheckpointVault& v) { ThrowIfErrorWithoutGil([&] { return v.ApplyRetention(); }); })
      .def("stats", [](const CheckpointVault& v) { return StatsDict(v.last_stats()); });
}

}  // namespace
LF_REGISTER_BINDINGS(ckpt, BindCkpt);
}  // namespace loongforge
