// Built-in tokenizers and the tokenizer registry.
#include "loongforge/tokenizer.h"

#include <map>
#include <mutex>

namespace loongforge::data {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, TokenizerFactory> factories;
};

Registry& GetRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: usable from static destructors
    reg->factories["byte-v1"] = []() -> StatusOr<std::unique_ptr<Tokenizer>> {
      return std::unique_ptr<Tokenizer>(new ByteTokenizer());
    };
    return reg;
  }();
  return *r;
}

}  // namespace

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 2);
  ids.push_back(kBos);
  for (unsigned char c : text) ids.push_back(static_cast<int32_t>(c) + kByteOffset);
  ids.push_back(kEos);
  return ids;
}

std::string ByteTokenizer::Decode(const int32_t* ids, size_t n) const {
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    int32_t id = ids[i];
    if (id == kPad || id == kBos || id == kEos) continue;
    if (id >= kByteOffset && id < kVocabSize) {
      out.push_back(static_cast<char>(id - kByteOffset));
    } else {
      out += "<?" + std::to_string(id) + ">";
    }
  }
  return out;
}

void RegisterTokenizer(const std::string& id, TokenizerFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[id] = std::move(factory);
}

StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& id) {
  TokenizerFactory f;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(id);
    if (it != r.factories.end()) f = it->second;
  }
  if (!f) {
    std::string known;
    for (const auto& k : KnownTokenizers()) known += (known.empty() ? "" : ", ") + k;
    return InvalidArgumentError("unknown tokenizer '" + id + "' (known: " + known + ")");
  }
  return f();
}

std::vector<std::string> KnownTokenizers() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> ids;
  for (const auto& [k, v] : r.factories) ids.push_back(k);
  return ids;
}

}  // namespace loongforge::data
