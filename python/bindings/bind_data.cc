// Bindings of DataFusion's loader: _C.DataLoader yields dicts of DLPack capsules (host memory, or
// CUDA device memory with device='cuda'), exported from Batch::Tensors() by the one producer
// (dlpack_capsule.h); dtypes and streams given from Python go through the converter
// (tensor_convert.h). _C.testing.NvJpegDecoder exposes the batch decoder alone (for benchmarks) in
// builds with nvJPEG.
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

#include "bindings.h"
#include "data/image_ops.h"
#include "dlpack_capsule.h"
#include "loongforge/loader.h"
#include "option_table.h"
#include "tensor_convert.h"
#ifdef LOONGFORGE_WITH_NVJPEG
#include "data/nvjpeg_decoder.h"
#endif

namespace loongforge {
namespace data {
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

// Note [Loader options]
// ---------------------
// LoaderOptions (include/loongforge/loader.h) is the one declaration of the loader's options and
// their defaults; the table below (Note [Option tables] in option_table.h) gives each field its
// Python name. _C.loader_options() reads the defaults from a default-constructed LoaderOptions,
// and loongforge.DataFusionLoader forwards its keyword arguments here. Adding a field to the
// struct means adding one line below.
using OptionField = loongforge::OptionField<LoaderOptions>;

template <typename T>
OptionField Plain(const char* name, T LoaderOptions::*m) {
  return loongforge::Plain("DataLoader", name, m);
}

template <typename E>
OptionField Choice(const char* name, E LoaderOptions::*m,
                   std::vector<std::pair<std::string, E>> names) {
  return loongforge::Choice("DataLoader", name, m, std::move(names));
}

// LoaderOptions::dtype: a torch.dtype or a dtype name (ToDType), of the kinds CheckImageDType
// takes; read back as torch's name ("float32").
OptionField ImageDTypeField() {
  return {"dtype",
          [](LoaderOptions& o, py::handle v) {
            o.dtype = ValueOrThrow(ToDType(v, "DataLoader: option 'dtype'"));
            ThrowIfError(CheckImageDType(o.dtype));
          },
          [](const LoaderOptions& o) -> py::object { return py::str(DTypeLongName(o.dtype)); }};
}

// LoaderOptions::image_size: N (N x N) or (height, width); read back as (height, width). Bounds are
// Create's.
OptionField ImageSizeField() {
  return {"image_size",
          [](LoaderOptions& o, py::handle v) {
            auto bad = [&] {
              ThrowStatus(InvalidArgumentError(
                  "DataLoader: option 'image_size' must be an int or (height, width), got " +
                  py::repr(v).cast<std::string>()));
            };
            auto side = [&](py::handle x) {
              if (py::isinstance<py::bool_>(x) || !py::isinstance<py::int_>(x)) bad();
              long long n = 0;
              try {
                n = x.cast<long long>();
              } catch (const py::cast_error&) {
                bad();
              }
              if (n < std::numeric_limits<int>::min() || n > std::numeric_limits<int>::max()) bad();
              return static_cast<int>(n);
            };
            if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)) {
              const int n = side(v);
              o.image_size = {n, n};
              return;
            }
            if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v)) bad();
            const py::sequence s = py::reinterpret_borrow<py::sequence>(v);
            if (py::len(s) != 2) bad();
            o.image_size = {side(s[0]), side(s[1])};
          },
          [](const LoaderOptions& o) -> py::object {
            return py::make_tuple(o.image_size[0], o.image_size[1]);
          }};
}

#ifdef LOONGFORGE_WITH_NVJPEG
// NvJpegDecoderOptions by Python name (Note [Option tables]); `cpu_pool` is C++ only, and `async_`
// is spelled so because `async` is a Python keyword.
const std::vector<loongforge::OptionField<internal::NvJpegDecoderOptions>>& NvJpegFields() {
  using O = internal::NvJpegDecoderOptions;
  static const char* const w = "NvJpegDecoder";
  static const std::vector<loongforge::OptionField<O>> fields = {
      loongforge::Plain(w, "device", &O::device),
      loongforge::Plain(w, "hw_ratio", &O::hw_ratio),
      loongforge::Plain(w, "hw", &O::allow_hardware),
      loongforge::Plain(w, "timeout_ms", &O::timeout_ms),
      loongforge::Plain(w, "max_frame_pixels", &O::max_frame_pixels),
      loongforge::Plain(w, "async_", &O::async),
      loongforge::Plain(w, "lanes", &O::lanes),
      loongforge::Plain(w, "hw_handle_per_lane", &O::hw_handle_per_lane),
      loongforge::Plain(w, "interleaved", &O::interleaved),
      loongforge::Plain(w, "reuse_state", &O::reuse_state),
      loongforge::Plain(w, "device_padding", &O::device_padding),
      loongforge::Plain(w, "pinned_padding", &O::pinned_padding),
      loongforge::Plain(w, "stagger", &O::stagger),
  };
  return fields;
}
#endif

const std::vector<OptionField>& OptionFields() {
  static const std::vector<OptionField> fields = {
      Plain("batch_size", &LoaderOptions::batch_size),
      ImageSizeField(),
      Plain("crop_fraction", &LoaderOptions::crop_fraction),
      Choice("resize", &LoaderOptions::resize,
             {{"stretch", ResizeMode::kStretch},
              {"crop", ResizeMode::kCrop},
              {"pad", ResizeMode::kPad}}),
      Plain("train", &LoaderOptions::train),
      Plain("color_jitter", &LoaderOptions::color_jitter),
      Plain("mean", &LoaderOptions::mean),
      Plain("std", &LoaderOptions::std),
      Plain("dct_scaling", &LoaderOptions::dct_scaling),
      Plain("max_frame_pixels", &LoaderOptions::max_frame_pixels),
      Plain("normalize_state", &LoaderOptions::normalize_state),
      Choice("normalize", &LoaderOptions::normalize,
             {{"mean_std", StateNormalization::kMeanStd},
              {"min_max", StateNormalization::kMinMax},
              {"q01_q99", StateNormalization::kQ01Q99},
              {"none", StateNormalization::kNone}}),
      Plain("seed", &LoaderOptions::seed),
      Plain("rank", &LoaderOptions::rank),
      Plain("world_size", &LoaderOptions::world_size),
      Plain("shuffle", &LoaderOptions::shuffle),
      Plain("drop_last", &LoaderOptions::drop_last),
      Plain("threads", &LoaderOptions::threads),
      Plain("prefetch", &LoaderOptions::prefetch),
      Plain("token_pad", &LoaderOptions::token_pad),
      Plain("token_buckets", &LoaderOptions::token_buckets),
      Plain("static_shapes", &LoaderOptions::static_shapes),
      Plain("truncate_tokens", &LoaderOptions::truncate_tokens),
      Choice("on_corrupt", &LoaderOptions::on_corrupt,
             {{"skip", CorruptPolicy::kSkip}, {"error", CorruptPolicy::kError}}),
      Plain("max_consecutive_corrupt", &LoaderOptions::max_consecutive_corrupt),
      Plain("pin_memory", &LoaderOptions::pin_memory),
      Plain("timeout_ms", &LoaderOptions::timeout_ms),
      Choice("device", &LoaderOptions::device,
             {{"cpu", LoaderDevice::kCpu}, {"cuda", LoaderDevice::kCuda}}),
      Plain("device_id", &LoaderOptions::device_id),
      Choice("layout", &LoaderOptions::layout,
             {{"NCHW", ImageLayout::kNCHW}, {"NHWC", ImageLayout::kNHWC}}),
      ImageDTypeField(),
      Plain("antialias", &LoaderOptions::antialias),
      Plain("hw_decode", &LoaderOptions::hw_decode),
      Plain("hw_decode_ratio", &LoaderOptions::hw_decode_ratio),
      Plain("async_decode", &LoaderOptions::async_decode),
      Plain("decode_lanes", &LoaderOptions::decode_lanes),
      Plain("decode_stagger", &LoaderOptions::decode_stagger),
      Plain("decode_reuse", &LoaderOptions::decode_reuse),
      Plain("decode_hw_handle_per_lane", &LoaderOptions::decode_hw_handle_per_lane),
      Plain("decode_interleaved", &LoaderOptions::decode_interleaved),
      Plain("stage3_on_device", &LoaderOptions::stage3_on_device),
      Plain("reserve_slots", &LoaderOptions::reserve_slots),
      Choice("prefault", &LoaderOptions::prefault,
             {{"off", PrefaultMode::kOff},
              {"touch", PrefaultMode::kTouch},
              {"populate", PrefaultMode::kPopulate}}),
  };
  return fields;
}

LoaderOptions OptionsFromKwargs(const std::string& db, const py::kwargs& kw) {
  LoaderOptions o;
  o.db_path = db;
  ApplyOptions(OptionFields(), "DataLoader", kw, &o);
  return o;
}

py::dict BatchDict(std::shared_ptr<Batch> b) {
  std::shared_ptr<const void> owner = b;
  py::dict d;
  for (const auto& [name, view] : b->Tensors()) d[py::str(name)] = dlpack::MakeCapsule(owner, view);
  d["device_type"] = b->device_type;
  d["epoch"] = b->epoch;
  d["index"] = b->index;
  d["size"] = b->size;
  d["rows"] = b->rows;
  d["bucket"] = b->token_bucket;
  d["tokens_len"] = b->tokens_len;
  d["pinned"] = b->pinned;
  d["latency_ms"] = b->latency_ms;
  d["held_by"] = b->held_by;
  d["wait_ms"] = b->wait_ms;
  if (!b->task.empty()) {  // Note [Task text]; bytes the DB holds are not trusted to be UTF-8
    py::list task;
    for (const std::string& t : b->task) {
      PyObject* s = PyUnicode_DecodeUTF8(t.data(), static_cast<Py_ssize_t>(t.size()), "replace");
      if (!s) throw py::error_already_set();
      task.append(py::reinterpret_steal<py::object>(s));
    }
    d["task"] = task;
  }
  return d;
}

py::dict DeviceInfoDict(const LoaderDeviceInfo& i) {
  py::dict d;
  d["gpu"] = i.gpu;
  d["hw_decode"] = i.hw_decode;
  d["decode_backend"] = i.decode_backend;
  d["reason"] = i.reason;
  d["hw_ratio"] = i.hw_ratio;
  d["ratio_measured"] = i.ratio_measured;
  d["images_hw"] = i.images_hw;
  d["images_cuda"] = i.images_cuda;
  d["images_cpu"] = i.images_cpu;
  d["stage3_on_device"] = i.stage3_on_device;
  if (i.gpu) {
    d["decode_lanes"] = i.decode_lanes;
    d["decode_stagger"] = i.decode_stagger;
    // Host ms per decoded batch (Note [Decode turns] in src/data/nvjpeg_decoder.h).
    const double nb = static_cast<double>(std::max<int64_t>(1, i.decoded_batches));
    d["decoded_batches"] = i.decoded_batches;
    d["decode_host_ms_per_batch"] = py::dict(
        py::arg("release_wait") = i.decode_release_wait_ms / nb,
        py::arg("prepare") = i.decode_prepare_ms / nb,
        py::arg("turn_wait") = i.decode_turn_wait_ms / nb, py::arg("call") = i.decode_call_ms / nb);
  }
  return d;
}

void BindData(py::module_& m) {
  py::class_<RecordReader>(
      m, "RecordReader", "Read-only access to a packed dataset's raw records (copies into bytes).")
      .def(py::init([](const std::string& path) { return ValueOrThrow(RecordReader::Open(path)); }),
           py::arg("path"))
      .def(
          "get",
          [](const RecordReader& r, const std::string& key) {
            auto txn = ValueOrThrow(r.Begin());
            std::string_view v = ValueOrThrow(txn.Get(key));
            return py::bytes(v.data(), v.size());
          },
          py::arg("key"), "The record's bytes; FileNotFoundError naming the key if absent.")
      .def("keys", [](const RecordReader& r) { return ValueOrThrow(r.Keys()); })
      .def_property_readonly("schema_json",
                             [](const RecordReader& r) { return r.schema().ToJson(); })
      .def_property_readonly("size_bytes", &RecordReader::size_bytes);

  py::class_<RecordWriter>(m, "RecordWriter",
                           "Writes a packed dataset (synthetic data for tests and benchmarks).")
      .def(py::init([](const std::string& path, bool overwrite) {
             return ValueOrThrow(RecordWriter::Create(path, overwrite));
           }),
           py::arg("path"), py::arg("overwrite") = false)
      .def(
          "put",
          [](RecordWriter& w, const std::string& key, const py::bytes& value) {
            char* p = nullptr;
            Py_ssize_t len = 0;
            PyBytes_AsStringAndSize(value.ptr(), &p, &len);
            ThrowIfError(w.Put(key, std::string_view(p, static_cast<size_t>(len))));
          },
          py::arg("key"), py::arg("value"))
      .def(
          "commit",
          [](RecordWriter& w, const std::string& schema_json) {
            Schema s = ValueOrThrow(Schema::FromJson(schema_json, "schema_json"));
            ThrowIfErrorWithoutGil([&] { return w.Commit(s); });
          },
          py::arg("schema_json"), "Writes the schema record and publishes the DB atomically.");

  py::class_<DataLoader>(m, "DataLoader", "DataFusion loader (use loongforge.DataFusionLoader)")
      .def(py::init([](const std::string& db, py::kwargs kw) {
             LoaderOptions o = OptionsFromKwargs(db, kw);
             return ValueOrThrowWithoutGil([&] { return DataLoader::Create(o); });
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
            StatusOr<std::shared_ptr<Batch>> b = CallWithoutGil([&] { return d.Next(); });
            if (!b.ok() && b.status().code() == StatusCode::kOutOfRange) return py::none();
            return BatchDict(ValueOrThrow(std::move(b)));
          },
          "Next batch as a dict of DLPack capsules, or None at the end of the epoch.")
      .def(
          "get_sample",
          [](DataLoader& d, int64_t sample, int64_t epoch) -> py::object {
            StatusOr<std::shared_ptr<Batch>> b =
                CallWithoutGil([&] { return d.GetSample(sample, epoch); });
            if (!b.ok() && b.status().code() == StatusCode::kOutOfRange) {
              PyErr_SetString(PyExc_IndexError, b.status().message().c_str());
              throw py::error_already_set();
            }
            return BatchDict(ValueOrThrow(std::move(b)));
          },
          py::arg("sample"), py::arg("epoch") = 0,
          "Sample `sample` as a batch of one row (DataLoader::GetSample); IndexError naming the "
          "sample and the length when out of range.")
      .def_property_readonly("num_samples", [](DataLoader& d) { return d.schema().num_samples; })
      .def("stop",
           [](DataLoader& d) {
             py::gil_scoped_release nogil;
             d.Stop();
           })
      .def_property_readonly("batches_per_epoch", &DataLoader::batches_per_epoch)
      .def_property_readonly("epoch", &DataLoader::epoch)
      .def_property_readonly("next_batch", &DataLoader::next_batch)
      .def_property_readonly("corrupt_skipped", &DataLoader::corrupt_skipped)
      .def_property_readonly("token_buckets", &DataLoader::token_buckets)
      .def_property_readonly("has_task_text", &DataLoader::has_task_text)
      .def_property_readonly("schema_json", [](DataLoader& d) { return d.schema().ToJson(); })
      .def("metrics",
           [](DataLoader& d) {
             py::dict out, hist, cnt;
             for (const auto& [k, s] : d.metrics().Histograms()) hist[py::str(k)] = SummaryDict(s);
             for (const auto& [k, v] : d.metrics().Counters()) cnt[py::str(k)] = v;
             out["histograms"] = hist;
             out["counters"] = cnt;
             out["device"] = DeviceInfoDict(d.device_info());
             return out;
           })
      .def("device_info", [](DataLoader& d) { return DeviceInfoDict(d.device_info()); })
      .def(
          "set_consumer_stream",
          [](DataLoader& d, py::object stream) {
            d.SetConsumerStream(ValueOrThrow(ToCudaStream(stream, "set_consumer_stream: stream")));
          },
          py::arg("stream"),
          "CUDA stream the batches are read on: a torch.cuda.Stream, an int cudaStream_t, or None "
          "(the legacy default stream). Released batches are rewritten only after the work "
          "queued on it before the release; ValueError for anything else.");

  m.def(
      "gpu_loader_support",
      [](int device_id) {
        std::string reason;
        bool ok = DataLoader::GpuSupport(device_id, &reason);
        return py::make_tuple(ok, reason);
      },
      py::arg("device_id") = 0, "(available, reason) for DataLoader(device='cuda').");
  m.def(
      "loader_options", [] { return OptionDefaults(OptionFields()); },
      "Every DataLoader option and its default (Note [Loader options]).");
  m.def(
      "loader_image_dtype",
      [](py::object dtype) {
        const DType d = ValueOrThrow(ToDType(dtype, "DataLoader: option 'dtype'"));
        ThrowIfError(CheckImageDType(d));
        return DTypeLongName(d);
      },
      py::arg("dtype"),
      "torch's name of an image dtype the loader writes (a torch.dtype or a name: 'float32', "
      "'bf16', ...); ValueError naming the option for any other.");
  m.def(
      "sort_token_buckets",
      [](std::vector<int> buckets) { return ValueOrThrow(SortTokenBuckets(std::move(buckets))); },
      py::arg("buckets"),
      "Token buckets sorted and deduplicated, as the loader uses them; ValueError for a length "
      "that is not positive.");
  m.def("token_bucket_for", &TokenBucketFor, py::arg("buckets"), py::arg("length"),
        "Index of the smallest of the sorted `buckets` >= length (the loader's choice), or -1.");
  py::module_ testing = TestingModule(m);
  testing.def(
      "crop_resize_normalize",
      [](const py::bytes& rgb, int width, int height, std::array<float, 4> box, int out_w,
         int out_h, std::optional<std::array<float, 4>> jitter, float gray_mean,
         std::array<float, 3> mean, std::array<float, 3> std) {
        // Tests only: the CPU loader's fused transform (internal::CropResizeNormalize).
        const std::string_view px = rgb;
        if (width <= 0 || height <= 0 || px.size() != static_cast<size_t>(width) * height * 3)
          ThrowStatus(InvalidArgumentError("crop_resize_normalize: rgb is not width*height*3"));
        if (out_w <= 0 || out_h <= 0 || box[2] < 1 || box[3] < 1 || box[0] < 0 || box[1] < 0 ||
            box[0] + box[2] > width || box[1] + box[3] > height)
          ThrowStatus(InvalidArgumentError("crop_resize_normalize: bad box or output size"));
        internal::RgbImage img;
        img.pixels.assign(px.begin(), px.end());
        img.width = width;
        img.height = height;
        internal::Jitter j;
        if (jitter) {
          j.enabled = true;
          j.brightness = (*jitter)[0], j.contrast = (*jitter)[1], j.saturation = (*jitter)[2];
          j.hue = (*jitter)[3];
        }
        std::vector<float> out(static_cast<size_t>(3) * out_w * out_h);
        internal::CropResizeNormalize(img, internal::CropBox{box[0], box[1], box[2], box[3]}, out_w,
                                      out_h, j, gray_mean, internal::NormalizeParams{mean, std},
                                      out.data());
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
      },
      py::arg("rgb"), py::arg("width"), py::arg("height"), py::arg("box"), py::arg("out_w"),
      py::arg("out_h"), py::arg("jitter") = py::none(), py::arg("gray_mean") = 0.f,
      py::arg("mean") = std::array<float, 3>{0.5f, 0.5f, 0.5f},
      py::arg("std") = std::array<float, 3>{0.5f, 0.5f, 0.5f},
      "The CPU loader's crop + bilinear resize + colour jitter (brightness, contrast, "
      "saturation, hue: Note [Colour jitter]) + normalize of an RGB8 HWC image; float32 [3, out_h, "
      "out_w] as bytes. `box` = (x0, y0, w, h); `gray_mean` is contrast's mean gray (0..255).");
  testing.def(
      "mean_gray",
      [](const py::bytes& rgb, int width, int height, std::array<float, 4> box, int step) {
        const std::string_view px = rgb;
        if (width <= 0 || height <= 0 || step <= 0 ||
            px.size() != static_cast<size_t>(width) * height * 3)
          ThrowStatus(InvalidArgumentError("mean_gray: rgb is not width*height*3"));
        internal::RgbImage img;
        img.pixels.assign(px.begin(), px.end());
        img.width = width;
        img.height = height;
        return internal::MeanGray(img, internal::CropBox{box[0], box[1], box[2], box[3]}, step);
      },
      py::arg("rgb"), py::arg("width"), py::arg("height"), py::arg("box"), py::arg("step") = 4,
      "The loader's contrast mean (internal::MeanGray) of `box`, every `step` pixels.");

#ifdef LOONGFORGE_WITH_NVJPEG
  using internal::NvJpegBatchDecoder;
  TestingModule(m).def(
      "nvjpeg_options", [] { return OptionDefaults(NvJpegFields()); },
      "NvJpegDecoder's options and their defaults (NvJpegDecoderOptions)");
  // The decoder and the bytes of the batches submitted and not yet collected (`held` is declared
  // first so the decoder, whose lanes may read them, is destroyed before them).
  struct PyNvJpegDecoder {
    std::deque<py::list> held;
    std::unique_ptr<NvJpegBatchDecoder> dec;
  };
  auto views_of = [](const py::list& files) {
    std::vector<std::string_view> views;
    for (const py::handle f : files) {
      char* p = nullptr;
      Py_ssize_t len = 0;
      if (PyBytes_AsStringAndSize(f.ptr(), &p, &len) != 0) throw py::error_already_set();
      views.emplace_back(p, static_cast<size_t>(len));
    }
    return views;
  };
  auto name_of = [](size_t i) { return "image " + std::to_string(i); };
  py::class_<PyNvJpegDecoder>(
      TestingModule(m), "NvJpegDecoder",
      "nvJPEG batch decoder alone (benchmarks): decode() is synchronous; submit()/collect() keep "
      "up to `lanes` batches in flight (async=True: one lane thread each)")
      .def(py::init([](const py::kwargs& kw) {
             internal::NvJpegDecoderOptions o;
             ApplyOptions(NvJpegFields(), "NvJpegDecoder", kw, &o);
             auto d = std::make_unique<PyNvJpegDecoder>();
             d->dec = ValueOrThrow(NvJpegBatchDecoder::Create(o));
             return d;
           }),
           "Keyword options of NvJpegDecoderOptions (_C.testing.nvjpeg_options() lists them with "
           "their defaults)")
      .def(
          "decode",
          [views_of, name_of](PyNvJpegDecoder& d, const py::list& files) {
            if (!d.held.empty()) ThrowStatus(FailedPreconditionError("collect() first"));
            std::vector<std::string_view> views = views_of(files);
            std::vector<Status> st;
            // The error is raised once the GIL is back (as RecordWriter.commit).
            ThrowIfErrorWithoutGil([&]() -> Status {
              std::vector<internal::DecodedImage> out;
              Status s = d.dec->Decode(views, name_of, &out, &st);
              if (s.ok()) s = d.dec->ReleaseAfter(d.dec->stream());
              if (!s.ok()) return s;
              cudaError_t e = cudaStreamSynchronize(d.dec->stream());
              return e == cudaSuccess ? Status::Ok() : InternalError(cudaGetErrorString(e));
            });
            int ok = 0;
            for (const Status& s : st) ok += s.ok();
            return ok;
          },
          py::arg("files"), "Decodes a batch of JPEG bytes on the GPU; returns how many decoded.")
      .def(
          "submit",
          [views_of, name_of](PyNvJpegDecoder& d, const py::list& files) {
            std::vector<std::string_view> views = views_of(files);
            Status s;
            {
              py::gil_scoped_release nogil;
              s = d.dec->Submit(std::move(views), name_of);
            }
            ThrowIfError(s);
            d.held.push_back(files);
          },
          py::arg("files"),
          "Queues a batch (at most `lanes` submitted and not collected); the list is kept until "
          "collect() hands the batch out.")
      .def(
          "collect",
          [](PyNvJpegDecoder& d) {
            internal::NvJpegBatchDecoder::Result r;
            Status s;
            {
              py::gil_scoped_release nogil;
              s = d.dec->Collect(&r);
              // Complete (as decode()), then the lane may be reused.
              if (s.ok() && r.ready) {
                cudaError_t e = cudaEventSynchronize(r.ready);
                if (e != cudaSuccess) s = InternalError(cudaGetErrorString(e));
              }
              if (s.ok()) s = d.dec->ReleaseAfter(r.stream);
            }
            if (!d.held.empty()) d.held.pop_front();
            ThrowIfError(s);
            int ok = 0;
            for (const Status& st : r.status) ok += st.ok();
            return ok;
          },
          "Waits for the oldest submitted batch's decode to complete; returns how many decoded.")
      .def("in_flight", [](PyNvJpegDecoder& d) { return d.dec->in_flight(); })
      .def(
          "drain",
          [](PyNvJpegDecoder& d) {
            Status s;
            {
              py::gil_scoped_release nogil;
              s = d.dec->Drain();
            }
            d.held.clear();
            ThrowIfError(s);
          },
          "Waits for and drops every batch not collected.")
      .def("info", [](PyNvJpegDecoder& d) {
        internal::NvJpegDecoderInfo i = d.dec->info();
        py::dict r;
        r["hw_available"] = i.hw_available;
        r["backend"] = i.backend;
        r["reason"] = i.reason;
        r["hw_ratio"] = i.hw_ratio;
        r["ratio_measured"] = i.ratio_measured;
        r["hw_ms_per_image"] = i.hw_ms_per_image;
        r["cuda_ms_per_image"] = i.cuda_ms_per_image;
        r["images_hw"] = i.images_hw;
        r["images_cuda"] = i.images_cuda;
        r["images_cpu"] = i.images_cpu;
        r["lanes"] = i.lanes;
        r["async"] = i.async;
        r["state_inits"] = i.state_inits;
        r["stagger"] = i.stagger;
        const double nb = static_cast<double>(std::max<int64_t>(1, i.batches));
        r["batches"] = i.batches;
        r["host_ms_per_batch"] =
            py::dict(py::arg("release_wait") = i.release_wait_ms / nb,
                     py::arg("prepare") = i.prepare_ms / nb,
                     py::arg("turn_wait") = i.turn_wait_ms / nb, py::arg("call") = i.call_ms / nb);
        return r;
      });
#endif
}

}  // namespace
LF_REGISTER_BINDINGS(data, BindData);
}  // namespace data
}  // namespace loongforge
