// Bindings of DataFusion's sampler (include/loongforge/loader.h, src/data/sampler.cc) as
// _C.Sampler, so that every Python input pipeline (the trainer's baseline and tuned modes) visits
// samples in exactly DataFusion's order from the one implementation.
#include <pybind11/stl.h>

#include "bindings.h"
#include "loongforge/loader.h"
#include "option_table.h"

namespace loongforge {
namespace {

using data::Sampler;
using data::SamplerOptions;

// Sampler caches the last epoch's order in mutable members and is not thread-safe; the GIL stays
// held in every method (they are short), which serializes the calls.
void RegisterSampler(py::module_& m) {
  py::class_<Sampler> cls(m, "Sampler",
                          "This rank's sample order per epoch: a Fisher-Yates shuffle driven by "
                          "splitmix64 with Lemire's bounded draw, identical on every platform and "
                          "to DataFusionLoader's. Every rank gets the same number of batches.");
  using O = SamplerOptions;
  // SamplerOptions by Python name (Note [Option tables]).
  static const char* const w = "Sampler";
  static const std::vector<OptionField<O>> fields = {
      Plain(w, "seed", &O::seed),
      Plain(w, "rank", &O::rank),
      Plain(w, "world_size", &O::world_size),
      Plain(w, "shuffle", &O::shuffle),
      Plain(w, "drop_last", &O::drop_last),
  };
  cls.def(py::init([](int64_t num_samples, int batch_size, const py::kwargs& kw) {
            O o;
            o.num_samples = num_samples;
            o.batch_size = batch_size;
            ApplyOptions(fields, "Sampler", kw, &o);
            return ValueOrThrow(Sampler::Create(o));
          }),
          py::arg("num_samples"), py::arg("batch_size"),
          "Keywords: seed, rank, world_size, shuffle, drop_last (SamplerOptions). ValueError for "
          "no samples, batch_size <= 0, a rank outside the world, or too few samples for one "
          "batch per rank.");
  cls.def_property_readonly("batches_per_epoch", &Sampler::batches_per_epoch)
      .def(
          "epoch_order", [](const Sampler& s, int64_t epoch) { return s.EpochOrder(epoch); },
          py::arg("epoch"),
          "This rank's sample indices for `epoch` (batches_per_epoch x batch_size of them with "
          "drop_last).")
      .def(
          "batch",
          [](const Sampler& s, int64_t epoch, int64_t b) {
            if (b < 0 || b >= s.batches_per_epoch())
              ThrowStatus(OutOfRangeError("sampler: batch " + std::to_string(b) + " not in [0, " +
                                          std::to_string(s.batches_per_epoch()) + ")"));
            return s.Batch(epoch, b);
          },
          py::arg("epoch"), py::arg("b"), "Sample indices of batch `b` of `epoch`, in order.");
}

}  // namespace
}  // namespace loongforge

LF_REGISTER_BINDINGS(sampler, loongforge::RegisterSampler);
