#include "engine/io/gguf.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/io/gguf_writer.h"

namespace kiln::io {
namespace {

using ::kiln::testing::GgufWriter;
using ::testing::HasSubstr;

std::string Floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(Gguf, ReadsMetadataAndTensorsInKilnOrder) {
  GgufWriter w(3, 64);
  w.Str("general.architecture", "llama");
  w.U32("general.alignment", 64);
  w.U32("llama.block_count", 2);
  w.F32("llama.rope.freq_base", 10000.f);
  w.Bool("tokenizer.ggml.add_bos_token", true);
  w.StrArray("tokenizer.ggml.tokens", {"<s>", "</s>", "hi"});
  // ne = [3, 2]: two rows of three, so Kiln's dims are [2, 3].
  w.Tensor("tok_embd.weight", {3, 2}, 0, Floats({1, 2, 3, 4, 5, 6}));
  std::string q8(2 * 34, '\x01');  // two q8_0 blocks: a row of 64
  w.Tensor("blk.0.ffn.weight", {64, 1}, 8, q8);
  std::string q4k(144, '\x02');
  w.Tensor("blk.0.attn_q.weight", {256}, 12, q4k);
  w.Tensor("odd.weight", {32}, 3, std::string(20, '\0'));  // q4_1: listed, not read

  const std::string path = ::testing::TempDir() + "/gguf_test_" + std::to_string(::getpid()) + ".gguf";
  std::ofstream(path, std::ios::binary) << w.Bytes();
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64);
  EXPECT_EQ(f->FindMetadata("general.architecture")->s, "llama");
  EXPECT_EQ(f->FindMetadata("llama.block_count")->AsInt(), 2);
  EXPECT_EQ(f->FindMetadata("llama.rope.freq_base")->f, 10000.0);
  EXPECT_EQ(f->FindMetadata("tokenizer.ggml.tokens")->array.at(2).s, "hi");
  ASSERT_EQ(f->tensors().size(), 4u);

  absl::StatusOr<HostTensor> emb = f->Read("tok_embd.weight");
  ASSERT_TRUE(emb.ok()) << emb.status();
  EXPECT_EQ(emb->dims(), (Dims{2, 3}));
  EXPECT_EQ(emb->GetAsDouble(4), 5.0);  // row 1, column 1
  absl::StatusOr<HostTensor> ffn = f->Read("blk.0.ffn.weight");
  ASSERT_TRUE(ffn.ok()) << ffn.status();
  EXPECT_EQ(ffn->dtype(), v1::DTYPE_Q8_0);
  EXPECT_EQ(ffn->dims(), (Dims{1, 64}));
  EXPECT_EQ(ffn->bytes(), q8);
  absl::StatusOr<HostTensor> q = f->Read("blk.0.attn_q.weight");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->dtype(), v1::DTYPE_Q4_K);
  absl::Status odd = f->Read("odd.weight").status();
  EXPECT_EQ(odd.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(odd.message()), HasSubstr("q4_1"));
  EXPECT_EQ(f->Read("nope").status().code(), absl::StatusCode::kNotFound);
  ::unlink(path.c_str());
}

TEST(Gguf, RefusesHostileFilesWithAClearError) {
  struct Case {
    const char* name;
    std::string bytes;
    const char* message;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  };
  std::vector<Case> cases;
  cases.push_back({"empty", "", "the magic needs 4 bytes"});
  cases.push_back({"magic", "GGML" + std::string(20, '\0'), "not a GGUF file"});
  {
    GgufWriter w(4);
    cases.push_back({"version", w.Bytes(), "version 4 is not supported"});
  }
  {
    GgufWriter w;
    cases.push_back({"tensor_count", w.Bytes(uint64_t{1} << 40), "over the limit",
                     absl::StatusCode::kResourceExhausted});
  }
  {
    GgufWriter w;
    w.Tensor("t", {4}, 0, Floats({1, 2, 3, 4}));
    std::string b = w.Bytes();
    cases.push_back({"truncated", b.substr(0, b.size() - 3), "runs past the end of the file"});
  }
  {
    GgufWriter w;
    std::string key = "k";
    std::string raw;
    const uint64_t len = 1;
    raw.append(reinterpret_cast<const char*>(&len), 8);
    raw += key;
    const uint32_t arr = 9, u64 = 10;
    const uint64_t count = uint64_t{1} << 23;
    raw.append(reinterpret_cast<const char*>(&arr), 4);
    raw.append(reinterpret_cast<const char*>(&u64), 4);
    raw.append(reinterpret_cast<const char*>(&count), 8);
    w.RawKv(raw, 1);
    cases.push_back({"array_count_past_file", w.Bytes(), "of 8388608 elements needs 67108864 bytes"});
  }
  {
    GgufWriter w;
    std::string raw;
    const uint64_t len = uint64_t{1} << 40;  // a string length past the file
    const uint64_t klen = 1;
    raw.append(reinterpret_cast<const char*>(&klen), 8);
    raw += "s";
    const uint32_t str = 8;
    raw.append(reinterpret_cast<const char*>(&str), 4);
    raw.append(reinterpret_cast<const char*>(&len), 8);
    w.RawKv(raw, 1);
    cases.push_back({"string_length", w.Bytes(), "over the limit", absl::StatusCode::kResourceExhausted});
  }
  {
    GgufWriter w;
    w.U32("k", 1);
    w.U32("k", 2);
    cases.push_back({"duplicate_key", w.Bytes(), "metadata 'k' is given twice"});
  }
  {
    GgufWriter w;
    w.U32("general.alignment", 24);
    cases.push_back({"alignment", w.Bytes(), "not a power of two"});
  }
  {
    GgufWriter w;
    w.Tensor("a", {4}, 99, Floats({1, 2, 3, 4}));
    cases.push_back({"unknown_type", w.Bytes(), "ggml type 99"});
  }
  {
    GgufWriter w;
    w.Tensor("a", {16}, 8, std::string(34, '\0'));
    cases.push_back({"partial_block", w.Bytes(), "not whole blocks of 32"});
  }
  {
    GgufWriter w;
    w.Tensor("a", {4}, 0, Floats({1, 2, 3, 4}), 0);
    w.Tensor("b", {4}, 0, Floats({1, 2, 3, 4}), 0);
    cases.push_back({"overlap", w.Bytes(), "overlaps tensor"});
  }
  {
    GgufWriter w;
    w.Tensor("a", {4}, 0, Floats({1, 2, 3, 4}), 4);
    cases.push_back({"misaligned", w.Bytes(), "not a multiple of the alignment 32"});
  }
  {
    GgufWriter w;
    w.Tensor("a", {uint64_t{1} << 62, 8}, 0, "");
    cases.push_back({"overflow", w.Bytes(), "overflows int64"});
  }
  {
    // Zero elements in GGUF's order, an overflow in Kiln's (HostTensor's):
    // found by the fuzzer (tests/fuzz/corpus/gguf/zero_dim_after_overflow.gguf).
    GgufWriter w;
    w.Tensor("a", {0, uint64_t{1} << 40, uint64_t{1} << 40}, 0, "");
    cases.push_back({"zero_dim_after_overflow", w.Bytes(), "overflows int64"});
  }
  {
    GgufWriter w;
    w.Tensor("a\nERROR forged", {1}, 0, Floats({1}));
    w.Tensor("a\nERROR forged", {1}, 0, Floats({1}));
    cases.push_back({"escaped_duplicate", w.Bytes(), "'a\\nERROR forged' is given twice"});
  }
  for (const Case& c : cases) {
    const absl::Status s = GgufFile::FromBytes(c.bytes).status();
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << c.name;
  }
}

}  // namespace
}  // namespace kiln::io
