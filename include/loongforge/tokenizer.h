// Tokenizers turn instruction text into token ids at pack time, so the training hot path only pads.
//
// A packed DB records the tokenizer id and vocabulary size in its schema; a loader or model checks
// them against its own. Built-in tokenizers are created by MakeTokenizer(id); others are added by
// registering a factory under a new id (RegisterTokenizer), e.g. from a module that wraps a
// SentencePiece or HF tokenizer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loongforge/status.h"

namespace loongforge::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Stable identifier recorded in the DB schema ("byte-v1").
  virtual std::string id() const = 0;
  // Every id returned by Encode() is in [0, vocab_size()).
  virtual int vocab_size() const = 0;
  // Token ids of `text`, including any begin/end markers the tokenizer defines; no padding.
  // Thread-safe (const, no shared mutable state).
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // Best-effort inverse of Encode() for display (inspect): special tokens are dropped, ids the
  // tokenizer does not know are shown as "<?id>".
  virtual std::string Decode(const int32_t* ids, size_t n) const = 0;
  std::string Decode(const std::vector<int32_t>& ids) const {
    return Decode(ids.data(), ids.size());
  }
  // The id used to pad token sequences in a batch.
  virtual int32_t pad_id() const { return 0; }
};

// The built-in byte-level tokenizer "byte-v1": 0 = pad, 1 = bos, 2 = eos, byte b -> b + 3
// (vocab 259). Encode(text) = [bos, bytes of text (UTF-8 as stored) + 3..., eos].
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kPad = 0, kBos = 1, kEos = 2, kByteOffset = 3;
  static constexpr int kVocabSize = 256 + kByteOffset;
  std::string id() const override { return "byte-v1"; }
  int vocab_size() const override { return kVocabSize; }
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(const int32_t* ids, size_t n) const override;
};

using TokenizerFactory = std::function<StatusOr<std::unique_ptr<Tokenizer>>()>;

// Registers a factory for `id` (replaces an earlier one with the same id). Thread-safe.
void RegisterTokenizer(const std::string& id, TokenizerFactory factory);

// Creates the tokenizer named `id`. InvalidArgument (listing the known ids) if unknown.
StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& id);

// Ids MakeTokenizer() accepts, sorted.
std::vector<std::string> KnownTokenizers();

}  // namespace loongforge::data
