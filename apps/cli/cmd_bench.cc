// `loongforge bench loader`: measures the DataFusion loader (CPU or GPU) on a packed DB:
// model-ready samples/s, inter-batch interval p50/p99/std as the consumer sees it, pipeline
// latency, CPU time per image and resident memory per epoch (flatness).
#include <sys/resource.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "cli.h"
#include "loongforge/loader.h"
#include "loongforge/metrics.h"

namespace loongforge {
namespace cli {
namespace {

using data::DataLoader;
using data::LoaderDevice;
using data::LoaderDeviceInfo;
using data::LoaderOptions;

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

// Decode threads `bench loader` accepts: well past any core count that helps, well short of a
// thread count that exhausts the process's limits.
constexpr int kMaxBenchThreads = 256;

// Flags of `bench loader` that are not LoaderOptions fields.
struct BenchFlags {
  int epochs = 1, max_batches = 0, warmup = 3;
  std::string device = "cpu";
  bool no_dct = false, json = false;
  int image_side = 0;  // --image-size N: N x N output; 0 keeps LoaderOptions::image_size
};

Status BenchLoader(LoaderOptions o, const BenchFlags& f) {
  const int epochs = f.epochs, max_batches = f.max_batches, warmup = f.warmup;
  o.dct_scaling = !f.no_dct;
  if (f.image_side > 0) o.image_size = {f.image_side, f.image_side};
  if (f.device == "cuda") o.device = LoaderDevice::kCuda;
  auto dl = DataLoader::Create(o);
  if (!dl.ok()) return dl.status();
  Histogram interval;
  std::vector<int64_t> rss_per_epoch;
  int64_t samples = 0, images0 = 0;
  double t0 = 0, cpu0 = 0;
  int seen = 0;
  for (int ep = 0; ep < epochs; ++ep) {
    LF_RETURN_IF_ERROR((*dl)->Start(ep));
    double last = NowSeconds();
    for (int b = 0; max_batches <= 0 || b < max_batches; ++b) {
      auto batch = (*dl)->Next();
      if (!batch.ok()) {
        if (batch.status().code() == StatusCode::kOutOfRange) break;
        return batch.status();
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
  if (seen <= warmup + 1) return InvalidArgumentError("too few batches for a measurement");
  HistogramSummary iv = interval.Summary();
  HistogramSummary lat = (*dl)->metrics().Histograms()["batch_latency_ms"];
  double sps = samples / wall;
  double cpu_ms_per_image = images > 0 ? 1e3 * cpu / images : 0;
  if (f.json) {
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
                o.batch_size, o.threads, o.image_size[1], o.image_size[0]);
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
  return Status::Ok();
}

void AddBench(CLI::App& root) {
  CLI::App* bench = AddCommand(root, "bench", "benchmarks: `bench loader` (DataFusion loader)");
  auto o = std::make_shared<LoaderOptions>();
  auto f = std::make_shared<BenchFlags>();
  CLI::App* app = AddCommand(*bench, "loader",
                             "model-ready samples/s, batch interval p50/p99/std, pipeline "
                             "latency, CPU per image and RSS per epoch of the loader on a DB",
                             [o, f] { return BenchLoader(*o, *f); });
  app->add_option("--db", o->db_path, "packed dataset (loongforge pack)")->required();
  app->add_option("--batch", o->batch_size, "batch size")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app->add_option("--threads", o->threads, "decode threads")
      ->check(CLI::Range(1, kMaxBenchThreads))
      ->capture_default_str();
  app->add_option("--prefetch", o->prefetch, "batches in flight")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--image-size", f->image_side, "output side (default 224)")
      ->check(CLI::Range(1, 4096));
  app->add_option("--epochs", f->epochs, "epochs to run")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app->add_option("--max-batches", f->max_batches,
                  "stop each epoch after this many batches (0 = all)")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  app->add_option("--warmup", f->warmup, "batches excluded from the timing")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  app->add_option("--device", f->device,
                  "cpu | cuda (nvJPEG + fused kernel; needs a build with nvJPEG)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app->add_option("--token-buckets", o->token_buckets,
                  "static batches: token lengths, e.g. 32,64,128")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--max-frame-pixels", o->max_frame_pixels,
                  "a record whose JPEG header claims more pixels is corrupt")
      ->check(CLI::Range(int64_t{1}, INT64_MAX))
      ->capture_default_str();
  app->add_flag("--static-shapes", o->static_shapes,
                "static batches (one bucket unless --token-buckets)");
  app->add_flag("--truncate-tokens", o->truncate_tokens,
                "cut instructions longer than the largest bucket");
  app->add_flag("--jitter", o->color_jitter, "colour jitter on");
  app->add_flag("--no-dct", f->no_dct, "disable DCT-domain scaling");
  app->add_flag("--json", f->json, "print one JSON object");
}

}  // namespace
LF_CLI_COMMAND(AddBench);
}  // namespace cli
}  // namespace loongforge
