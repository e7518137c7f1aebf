// A packed dataset's data.mdb as RecordReader sees it: the input is written as data.mdb in a fixed
// scratch directory, then opened (size checks, LMDB meta pages, __schema__), its keys iterated and
// each record (up to 64) read back, as `loongforge inspect` and the loader do.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "loongforge/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = lf_fuzz::ScratchDir("lmdb") + "/db";
  lf_fuzz::WriteFile(dir + "/data.mdb",
                     std::string_view(reinterpret_cast<const char*>(data), size));
  auto reader = loongforge::data::RecordReader::Open(dir, 8);
  if (!reader.ok()) return 0;
  auto keys = (*reader)->Keys();
  if (!keys.ok()) return 0;
  auto txn = (*reader)->Begin();
  if (!txn.ok()) return 0;
  size_t n = 0;
  for (const std::string& k : *keys) {
    if (++n > 64) break;
    auto v = txn->Get(k);
    if (v.ok() && k.size() > 7 && k.compare(k.size() - 7, 7, "_tokens") == 0)
      (void)loongforge::data::CheckTokens(*v, (*reader)->schema(), dir, k);
  }
  return 0;
}
