// `loongforge bench loader`: measures the DataFusion CPU loader on a packed DB: model-ready
// samples/s, inter-batch interval p50/p99/std as the consumer sees it, pipeline latency, CPU time
// per image and resident memory per epoch (flatness).
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "cli.h"
#include "loongforge/loader.h"
#include "loongforge/metrics.h"

namespace loongforge {
namespace cli {
namespace {

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

int64_t RssKb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

using data::DataLoader;
using data::LoaderDevice;
using data::LoaderDeviceInfo;
using data::LoaderOptions;

int RunBenchLoader(int argc, char** argv) {
  Args a("bench loader", "--db DB [options]");
  a.Flag("db", "", "packed dataset (loongforge pack)")
      .Flag("batch", "32", "batch size")
      .Flag("threads", "2", "decode threads")
      .Flag("prefetch", "4", "batches in flight")
      .Flag("image-size", "224", "output side")
      .Flag("epochs", "1", "epochs to run")
      .Flag("max-batches", "0", "stop each epoch after this many batches (0 = all)")
      .Flag("warmup", "3", "batches excluded from the timing")
      .Flag("device", "cpu", "cpu | cuda (nvJPEG + fused kernel; needs a build with nvJPEG)")
      .Flag("token-buckets", "", "static batches: token lengths, e.g. 32,64,128")
      .Switch("static-shapes", "static batches (one bucket unless --token-buckets)")
      .Switch("truncate-tokens", "cut instructions longer than the largest bucket")
      .Switch("jitter", "colour jitter on")
      .Switch("no-dct", "disable DCT-domain scaling")
      .Switch("json", "print one JSON object");
  if (Status s = a.Parse(argc, argv); !s.ok()) return Fail("bench loader", s);
  if (a.help_requested()) {
    std::printf("%s", a.Usage().c_str());
    return 0;
  }
  if (a.Get("db").empty()) return Fail("bench loader", InvalidArgumentError("--db is required"));
  LoaderOptions o;
  o.db_path = a.Get("db");
  auto geti = [&](const char* n, int* out) -> Status {
    LF_ASSIGN_OR_RETURN(int64_t v, a.GetInt(n));
    *out = static_cast<int>(v);
    return Status::Ok();
  };
  int epochs = 1, max_batches = 0, warmup = 3;
  for (auto [name, dst] : {std::pair<const char*, int*>{"batch", &o.batch_size},
                           {"threads", &o.threads},
                           {"prefetch", &o.prefetch},
                           {"image-size", &o.image_size},
                           {"epochs", &epochs},
                           {"max-batches", &max_batches},
                           {"warmup", &warmup}})
    if (Status s = geti(name, dst); !s.ok()) return Fail("bench loader", s);
  o.color_jitter = a.Has("jitter");
  o.static_shapes = a.Has("static-shapes");
  o.truncate_tokens = a.Has("truncate-tokens");
  const std::string bucket_list = a.Get("token-buckets");
  for (size_t pos = 0; pos < bucket_list.size();) {
    size_t end = bucket_list.find(',', pos);
    if (end == std::string::npos) end = bucket_list.size();
    const std::string item = bucket_list.substr(pos, end - pos);
    char* stop = nullptr;
    const long v = std::strtol(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || v <= 0 || v > (1 << 20))
      return Fail("bench loader",
                  InvalidArgumentError("--token-buckets: '" + item + "' is not a positive length"));
    o.token_buckets.push_back(static_cast<int>(v));
    pos = end + 1;
  }
  o.dct_scaling = !a.Has("no-dct");
  if (a.Get("device") == "cuda")
    o.device = LoaderDevice::kCuda;
  else if (a.Get("device") != "cpu")
    return Fail("bench loader", InvalidArgumentError("--device must be cpu or cuda"));
  auto dl = DataLoader::Create(o);
  if (!dl.ok()) return Fail("bench loader", dl.status());
  Histogram interval;
  std::vector<int64_t> rss_per_epoch;
  int64_t samples = 0, images0 = 0;
  double t0 = 0, cpu0 = 0;
  int seen = 0;
  for (int ep = 0; ep < epochs; ++ep) {
    if (Status s = (*dl)->Start(ep); !s.ok()) return Fail("bench loader", s);
    double last = NowSeconds();
    for (int b = 0; max_batches <= 0 || b < max_batches; ++b) {
      auto batch = (*dl)->Next();
      if (!batch.ok()) {
        if (batch.status().code() == StatusCode::kOutOfRange) break;
        return Fail("bench loader", batch.status());
      }
      double now = NowSeconds();
      if (seen == warmup) {
        t0 = now;
        cpu0 = CpuSeconds();
        images0 = (*dl)->metrics().Counters()["images_decoded"];
      } else if (seen > warmup) {
        interval.Record((now - last) * 1e3);
        samples += (*batch)->size;
      }
      last = now;
      ++seen;
    }
    // A cut-short epoch restarts the pipeline; a finished one keeps prefetching the next.
    if (max_batches > 0) (*dl)->Stop();
    rss_per_epoch.push_back(RssKb());
  }
  double wall = NowSeconds() - t0, cpu = CpuSeconds() - cpu0;
  int64_t images = (*dl)->metrics().Counters()["images_decoded"] - images0;
  if (seen <= warmup + 1)
    return Fail("bench loader", InvalidArgumentError("too few batches for a measurement"));
  HistogramSummary iv = interval.Summary();
  HistogramSummary lat = (*dl)->metrics().Histograms()["batch_latency_ms"];
  double sps = samples / wall;
  double cpu_ms_per_image = images > 0 ? 1e3 * cpu / images : 0;
  if (a.Has("json")) {
    std::printf(
        "{\"samples_per_s\": %.2f, \"images_per_s\": %.2f, \"batches\": %lld, "
        "\"interval_ms\": %s, \"pipeline_latency_ms\": %s, \"cpu_ms_per_image\": %.3f, "
        "\"rss_kb_per_epoch\": [",
        sps, images / wall, static_cast<long long>(iv.count + 1), SummaryToJson(iv).c_str(),
        SummaryToJson(lat).c_str(), cpu_ms_per_image);
    for (size_t i = 0; i < rss_per_epoch.size(); ++i)
      std::printf("%s%lld", i ? ", " : "", static_cast<long long>(rss_per_epoch[i]));
    std::printf("], \"metrics\": %s}\n", (*dl)->metrics().ToJson().c_str());
  } else {
    std::printf("DataFusion loader: %s, batch %d, %d threads, %dx%d out\n", o.db_path.c_str(),
                o.batch_size, o.threads, o.image_size, o.image_size);
    std::printf("  samples/s          %.1f  (images/s %.1f)\n", sps, images / wall);
    std::printf("  interval ms        p50 %.2f  p99 %.2f  std %.2f (%.1f%% of mean)\n", iv.p50,
                iv.p99, iv.std, iv.mean > 0 ? 100 * iv.std / iv.mean : 0);
    std::printf("  pipeline latency   p50 %.2f ms  p99 %.2f ms\n", lat.p50, lat.p99);
    std::printf("  CPU per image      %.3f ms\n", cpu_ms_per_image);
    if (!(*dl)->token_buckets().empty()) {
      std::printf("  static shapes      token buckets");
      for (int b : (*dl)->token_buckets()) std::printf(" %d", b);
      std::printf("\n");
    }
    LoaderDeviceInfo di = (*dl)->device_info();
    std::printf("  decode             %s (hw_decode %s): %s\n", di.decode_backend.c_str(),
                di.hw_decode ? "yes" : "no", di.reason.c_str());
    std::printf("  RSS per epoch (MB)");
    for (int64_t r : rss_per_epoch) std::printf(" %.1f", r / 1024.0);
    std::printf("\n  stages:\n%s", (*dl)->metrics().ToText().c_str());
  }
  return 0;
}

int RunBench(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "loader") return RunBenchLoader(argc - 1, argv + 1);
  std::fprintf(stderr,
               "usage: loongforge bench loader --db DB [--batch 32 --threads 2 --json ...]\n");
  return 2;
}

}  // namespace
LF_CLI_COMMAND("bench", "benchmarks: `bench loader` (DataFusion CPU loader)", RunBench);
}  // namespace cli
}  // namespace loongforge
