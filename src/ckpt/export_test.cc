// Tests of the model-only safetensors export (Note [Model-only export] in lifecycle.cc): the
// structure chunk is followed, views of shared storage are gathered, a bad prefix is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "ckpt/ckpt_test_util.h"
#include "loongforge/ckpt.h"
#include "test_cli.h"

namespace loongforge {
namespace ckpt {
namespace {

// A safetensors file: its header and each tensor's bytes.
struct Safetensors {
  nlohmann::json header;
  std::map<std::string, std::string> data;
};

Safetensors ReadSafetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), {});
  Safetensors r;
  EXPECT_GE(all.size(), 8u) << path;
  if (all.size() < 8) return r;
  uint64_t hl = 0;
  for (int i = 0; i < 8; ++i) hl |= static_cast<uint64_t>(static_cast<uint8_t>(all[i])) << (8 * i);
  r.header = nlohmann::json::parse(all.substr(8, hl));
  size_t end = 0;
  for (const auto& [name, v] : r.header.items()) {
    if (name == "__metadata__") continue;
    const size_t b = v["data_offsets"][0].get<size_t>(), e = v["data_offsets"][1].get<size_t>();
    r.data[name] = all.substr(8 + hl + b, e - b);
    end = std::max(end, e);
  }
  EXPECT_EQ(all.size(), 8 + hl + end) << path << ": data beyond the last tensor";
  return r;
}

std::string Bytes(const State::T& t) { return std::string(t.bytes.begin(), t.bytes.end()); }

// What loongforge.ckpt saves for {"step": 5, "lr": nan, "note": ..., "model": sd, "optimizer":
// ...} where sd's emb.weight, head.weight and part share one storage (head is its transpose,
// part a slice of it).
struct PySaved {
  State s;
  std::string structure;
  PySaved() {
    s.Add("model/enc.weight", "f32", {2, 5}, 1);
    s.Add("model/emb.weight#storage", "f32", {12}, 2);
    s.Add("optimizer/state/0/exp_avg", "f32", {2, 5}, 3);
    const std::string json =
        R"({"root":{"dict":[["step",5],["lr",NaN],["note","NaN and -Infinity \"in\" a string"],)"
        R"(["model",{"odict":[["enc.weight",{"tensor":"model/enc.weight","device":"cpu",)"
        R"("requires_grad":false}],["emb.weight",{"view":"model/emb.weight#storage",)"
        R"("shape":[4,3],"stride":[3,1],"offset":0,"device":"cpu","requires_grad":false}],)"
        R"(["head.weight",{"view":"model/emb.weight#storage","shape":[3,4],"stride":[1,3],)"
        R"("offset":0,"device":"cpu","requires_grad":false}],)"
        R"(["part",{"view":"model/emb.weight#storage",)"
        R"("shape":[2,2],"stride":[3,1],"offset":1,"device":"cpu","requires_grad":false}]]}],)"
        R"(["optimizer",{"dict":[["state",{"dict":[[0,{"dict":[["exp_avg",)"
        R"({"tensor":"optimizer/state/0/exp_avg","device":"cpu","requires_grad":false}],)"
        R"(["max",-Infinity]]}]]}]]}]]}})";
    structure = "loongforge.ckpt.structure/1\n" + json;
    State::T meta{"__loongforge_meta__",
                  "u8",
                  {static_cast<int64_t>(structure.size())},
                  std::vector<uint8_t>(structure.begin(), structure.end())};
    s.ts.insert(s.ts.begin(), meta);
  }
  const State::T& Get(const std::string& name) const {
    for (const auto& t : s.ts)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
};

std::unique_ptr<CheckpointVault> SaveState(const std::string& dir, const State& s) {
  auto v = CheckpointVault::Open(dir, SmallOpts());
  EXPECT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE((*v)->Save(1, s.Refs()).ok());
  EXPECT_TRUE((*v)->Wait().ok());
  return std::move(v).value();
}

ExportOptions ModelOnly(const std::string& prefix = "model/") {
  ExportOptions o;
  o.model_only = true;
  o.strip_prefix = prefix;
  return o;
}

// Guards the model-only export of what the Python vault saves: exactly the model's tensors, keys
// without the prefix, tied weights each written in full (a transposed view gathered).
TEST(CkptExport, ModelOnlyFollowsTheStructure) {
  const std::string dir = TempDir("export_model");
  PySaved p;
  auto v = SaveState(dir, p.s);
  const std::string out = dir + "/model.safetensors";
  Status st = v->ExportSafetensors(1, out, ModelOnly());
  ASSERT_TRUE(st.ok()) << st;
  Safetensors f = ReadSafetensors(out);
  std::set<std::string> keys;
  for (const auto& [name, _] : f.header.items()) keys.insert(name);
  EXPECT_EQ(keys, (std::set<std::string>{"__metadata__", "enc.weight", "emb.weight", "head.weight",
                                         "part"}));
  EXPECT_EQ(f.header["__metadata__"], nlohmann::json({{"format", "pt"}}));
  EXPECT_EQ(f.header["enc.weight"]["shape"], nlohmann::json({2, 5}));
  EXPECT_EQ(f.header["emb.weight"]["shape"], nlohmann::json({4, 3}));
  EXPECT_EQ(f.header["head.weight"]["shape"], nlohmann::json({3, 4}));
  EXPECT_EQ(f.header["head.weight"]["dtype"], "F32");
  EXPECT_EQ(f.data["enc.weight"], Bytes(p.Get("model/enc.weight")));
  const std::string storage = Bytes(p.Get("model/emb.weight#storage"));
  EXPECT_EQ(f.data["emb.weight"], storage);
  std::string transposed;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) transposed += storage.substr((j * 3 + i) * 4, 4);
  EXPECT_EQ(f.data["head.weight"], transposed);
  // Rows of a slice: elements 1, 2 and 4, 5 of the storage.
  EXPECT_EQ(f.data["part"], storage.substr(4, 8) + storage.substr(16, 8));
  EXPECT_EQ(f.header["part"]["shape"], nlohmann::json({2, 2}));

  // A longer prefix strips more and selects less.
  ASSERT_TRUE(v->ExportSafetensors(1, out, ModelOnly("model/enc.")).code() ==
              StatusCode::kAlreadyExists);
  ExportOptions o = ModelOnly("model/enc.");
  o.replace = true;
  ASSERT_TRUE(v->ExportSafetensors(1, out, o).ok());
  f = ReadSafetensors(out);
  EXPECT_EQ(f.data.size(), 1u);
  EXPECT_EQ(f.data["weight"], Bytes(p.Get("model/enc.weight")));

  // The default export is unchanged: every chunk under its own name, with the step.
  const std::string all = dir + "/all.safetensors";
  ASSERT_TRUE(v->ExportSafetensors(1, all).ok());
  f = ReadSafetensors(all);
  EXPECT_EQ(f.data.size(), p.s.ts.size());
  EXPECT_EQ(f.header["__metadata__"]["loongforge_step"], "1");
  EXPECT_EQ(f.data["optimizer/state/0/exp_avg"], Bytes(p.Get("optimizer/state/0/exp_avg")));
}

// Guards the error of a prefix that selects nothing: it names the prefix and the keys there are,
// and writes no file.
TEST(CkptExport, PrefixMatchingNothingIsRefusedNamingIt) {
  const std::string dir = TempDir("export_bad_prefix");
  PySaved p;
  auto v = SaveState(dir, p.s);
  const std::string out = dir + "/model.safetensors";
  Status st = v->ExportSafetensors(1, out, ModelOnly("module/"));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("'module/'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("'model'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("'optimizer'"), std::string::npos) << st;
  EXPECT_FALSE(std::filesystem::exists(out));
  // The whole key path is not a prefix of itself plus a name: nothing would be left of it.
  EXPECT_EQ(v->ExportSafetensors(1, out, ModelOnly("model/enc.weight")).code(),
            StatusCode::kInvalidArgument);
}

// Guards a vault saved from C++ (no structure chunk): tensor names are the key paths.
TEST(CkptExport, ModelOnlyWithoutStructureMatchesNames) {
  const std::string dir = TempDir("export_plain");
  State s;
  s.Add("net/a", "bf16", {3, 7}, 1);
  s.Add("net/b", "i64", {4}, 2);
  s.Add("opt/m", "f32", {9}, 3);
  auto v = SaveState(dir, s);
  const std::string out = dir + "/net.safetensors";
  ASSERT_TRUE(v->ExportSafetensors(1, out, ModelOnly("net/")).ok());
  Safetensors f = ReadSafetensors(out);
  ASSERT_EQ(f.data.size(), 2u);
  EXPECT_EQ(f.data["a"], Bytes(s.ts[0]));
  EXPECT_EQ(f.data["b"], Bytes(s.ts[1]));
  EXPECT_EQ(f.header["a"]["dtype"], "BF16");
}

// Guards the structure being read as untrusted data: a view past its storage, or a node naming
// a chunk the manifest lacks, is DataLoss naming the key path; nothing is written.
TEST(CkptExport, StructureThatLiesIsDataLoss) {
  for (const auto& [bad, path] : std::vector<std::pair<std::string, std::string>>{
           {R"({"view":"model/s","shape":[4,4],"stride":[4,1],"offset":0})", "model/w"},
           {R"({"view":"model/s","shape":[2],"stride":[1],"offset":-1})", "model/w"},
           {R"({"tensor":"model/gone"})", "model/w"},
           {R"({"frob":1})", "model/w"}}) {
    const std::string dir = TempDir("export_lies");
    State s;
    s.Add("model/s", "f32", {12}, 1);
    const std::string text =
        "loongforge.ckpt.structure/1\n{\"root\":{\"dict\":[[\"model\",{"
        "\"dict\":[[\"w\"," +
        bad + "]]}]]}}";
    s.ts.push_back({"__loongforge_meta__",
                    "u8",
                    {static_cast<int64_t>(text.size())},
                    std::vector<uint8_t>(text.begin(), text.end())});
    auto v = SaveState(dir, s);
    const std::string out = dir + "/m.safetensors";
    Status st = v->ExportSafetensors(1, out, ModelOnly());
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << bad << ": " << st;
    EXPECT_NE(st.message().find(path), std::string::npos) << bad << ": " << st;
    EXPECT_FALSE(std::filesystem::exists(out)) << bad;
  }
}

// Guards the CLI flags: --model-only, --strip-prefix, and --strip-prefix alone refused.
TEST(CkptExport, CliModelOnly) {
  const std::string dir = TempDir("export_cli");
  PySaved p;
  SaveState(dir, p.s).reset();
  const std::string out = dir + "/m.safetensors";
  testing::CliResult r = testing::RunCli("ckpt export " + dir + " --out " + out + " --model-only");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadSafetensors(out).data.size(), 4u);
  r = testing::RunCli("ckpt export " + dir + " --out " + dir + "/n.safetensors --strip-prefix x/");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--model-only"), std::string::npos) << r.output;
  r = testing::RunCli("ckpt export " + dir + " --out " + dir +
                      "/n.safetensors --model-only --strip-prefix nope/");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("'nope/'"), std::string::npos) << r.output;
  r = testing::RunCli("ckpt export " + dir + " --out " + dir +
                      "/o.safetensors --model-only --strip-prefix model/enc.");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadSafetensors(dir + "/o.safetensors").data.count("weight"), 1u);
}

}  // namespace
}  // namespace ckpt
}  // namespace loongforge
