// Bindings of DataFusion's sampler (include/loongforge/loader.h, src/data/sampler.cc) as
// _C.Sampler, so that every Python input pipeline (the trainer's baseline and tuned modes) visits
// samples in exactly DataFusion's order from the one implementation.
#include <pybind11/stl.h>

#include "bindings.h"
#include "loongforge/loader.h"

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
  InitWithOptions<O>(
      cls,
      "ValueError for no samples, batch_size <= 0, a rank outside the world, or too few "
      "samples for one batch per rank.",
      [](const O& o) { return ValueOrThrow(Sampler::Create(o)); },
      Arg("num_samples", &O::num_samples), Arg("batch_size", &O::batch_size),
      Arg("seed", &O::seed, 0), Arg("rank", &O::rank, 0), Arg("world_size", &O::world_size, 1),
      Arg("shuffle", &O::shuffle, true), Arg("drop_last", &O::drop_last, true));
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
