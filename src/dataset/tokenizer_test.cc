// Tests of the tokenizers: the byte-v1 id layout every packed DB depends on, and the registry.
#include <gtest/gtest.h>

#include "loongforge/tokenizer.h"

namespace loongforge::data {
namespace {

// Guards the byte-v1 id layout that every packed DB depends on (0 pad, 1 bos, 2 eos, byte+3).
TEST(Tokenizer, ByteV1Layout) {
  auto tok = MakeTokenizer("byte-v1");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->id(), "byte-v1");
  EXPECT_EQ((*tok)->vocab_size(), 259);
  std::vector<int32_t> ids = (*tok)->Encode("Az\xff");
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 'A' + 3, 'z' + 3, 255 + 3, 2}));
  EXPECT_EQ((*tok)->Encode(""), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ((*tok)->Decode(ids), "Az\xff");
}

// Guards the factory: unknown ids are a caller error listing the known ones; registration works.
TEST(Tokenizer, FactoryRegistry) {
  auto bad = MakeTokenizer("sentencepiece-x");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("byte-v1"), std::string::npos);
  RegisterTokenizer("test-upper", []() -> StatusOr<std::unique_ptr<Tokenizer>> {
    return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  });
  EXPECT_TRUE(MakeTokenizer("test-upper").ok());
}

}  // namespace
}  // namespace loongforge::data
