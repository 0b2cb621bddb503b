// The quantization ops through the whole engine (parse, infer, legalize, plan,
// run on the CPU): a GGUF-style q8_0 weight as a param consumed by
// dequant_matmul and dequantize, and a quantize -> dequantize round trip. The
// kernels' arithmetic is the conformance suite's business; this checks that
// block-quantized params travel through compile and run intact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/common/quant_blocks.h"
#include "base/half.h"
#include "engine/engine.h"
#include "engine/io/gguf.h"
#include "engine/ir/text.h"
#include "tests/engine/io/gguf_writer.h"

namespace kiln {
namespace {

constexpr char kGraph[] = R"(graph "q"
input x: f32[2, 64]
param w: q8_0[3, 64]
let y = dequant_matmul(x, w, transpose_b=true)
let wd = dequantize(w, to=f32)
const s: f32[] = [0.5]
let q = quantize(x, s, bits=4, symmetric=true, to=i8)
let xd = dequantize(q, s)
out y
out wd
out xd
)";

TEST(QuantEngineTest, Q8_0ParamThroughDequantMatMulAndDequantize) {
  auto graph = ir::ParseGraphProto(kGraph);
  ASSERT_TRUE(graph.ok()) << graph.status();
  // w: 3 rows of 2 q8_0 blocks; block b of row n has d = 2^-(n + 1) (f16) and
  // quant i = (i + b) % 7 - 3, so w[n][32b + i] = 2^-(n + 1) * ((i + b) % 7 - 3).
  HostTensor w = std::move(HostTensor::Create(v1::DTYPE_Q8_0, {3, 64})).value();
  uint8_t* p = w.data_as<uint8_t>();
  const uint16_t half_pow[3] = {0x3800, 0x3400, 0x3000};  // 0.5, 0.25, 0.125
  auto weight = [](int n, int k) { return (1.0 / (2 << n)) * ((k % 32 + k / 32) % 7 - 3); };
  for (int n = 0; n < 3; ++n) {
    for (int b = 0; b < 2; ++b) {
      uint8_t* blk = p + (n * 2 + b) * 34;
      blk[0] = half_pow[n] & 0xff;
      blk[1] = half_pow[n] >> 8;
      for (int i = 0; i < 32; ++i)
        blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>((i + b) % 7 - 3));
    }
  }
  std::vector<float> xv(2 * 64);
  for (int i = 0; i < 128; ++i) xv[i] = static_cast<float>((i % 5) - 2) * 0.75f;
  xv[0] = 0.25f;  // 0.25 / 0.5 = 0.5, a tie: rounds to 0
  xv[1] = 0.75f;  // 1.5 rounds to 2
  xv[2] = 9.0f;   // saturates at 7 -> 3.5
  HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {2, 64}, xv);

  EngineOptions options;
  auto engine = Engine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const TensorRef params_list[] = {TensorRef::Of("w", w)};
  auto params = (*engine)->CreateParams(params_list);
  ASSERT_TRUE(params.ok()) << params.status();
  const TensorRef inputs[] = {TensorRef::Of("x", x)};
  RunOptions ro;
  ro.report = true;
  auto r = (*engine)->RunGraph(*graph, inputs, params->get(), {}, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 3u);

  const HostTensor& y = r->outputs[0].second;
  ASSERT_EQ(y.dims(), (Dims{2, 3}));
  for (int m = 0; m < 2; ++m) {
    for (int n = 0; n < 3; ++n) {
      double want = 0;
      for (int k = 0; k < 64; ++k) want += xv[m * 64 + k] * weight(n, k);
      EXPECT_NEAR(y.data_as<float>()[m * 3 + n], want, 1e-4) << m << "," << n;
    }
  }
  const HostTensor& wd = r->outputs[1].second;
  ASSERT_EQ(wd.dims(), (Dims{3, 64}));
  for (int i = 0; i < 192; ++i) EXPECT_EQ(wd.data_as<float>()[i], weight(i / 64, i % 64)) << i;
  const HostTensor& xd = r->outputs[2].second;
  EXPECT_EQ(xd.data_as<float>()[0], 0.0f);
  EXPECT_EQ(xd.data_as<float>()[1], 1.0f);
  EXPECT_EQ(xd.data_as<float>()[2], 3.5f);
  // The rest: (i % 5 - 2) * 0.75 / 0.5 = +-1.5 or +-3 (ties to even: +-2) or 0.
  EXPECT_EQ(xd.data_as<float>()[3], 1.0f);   // 1.5 -> 2
  EXPECT_EQ(xd.data_as<float>()[4], 1.5f);   // 3
  EXPECT_EQ(xd.data_as<float>()[5], -1.5f);  // -3
  EXPECT_EQ(xd.data_as<float>()[6], -1.0f);  // -1.5 -> -2

  bool saw = false;
  for (const auto& step : r->report.steps()) {
    if (step.implementation().find("dequant_matmul_q8_0_small_batch") != std::string::npos)
      saw = true;
  }
  EXPECT_TRUE(saw) << r->report.DebugString();
}

// A linear layer's weight as GGUF stores it (ne = {K, N}, K fastest, ggml type
// Q4_K = 12 / Q6_K = 14), read by engine/io/gguf.h into [N, K] and consumed by
// dequant_matmul(transpose_b=true) without a copy or a transpose: the result
// equals x @ dequantize(w)^T decoded from the file's bytes.
TEST(QuantEngineTest, GgufWeightFeedsDequantMatMul) {
  constexpr int64_t kK = 512, kN = 5;
  struct Type {
    uint32_t ggml;
    DType dtype;
  };
  for (const Type t : {Type{12, v1::DTYPE_Q4_K}, Type{14, v1::DTYPE_Q6_K}}) {
    const DTypeLayout l = LayoutOf(t.dtype);
    std::string bytes(kN * kK / l.block_elems * l.block_bytes, '\0');
    std::mt19937 rng(3);
    for (char& c : bytes) c = static_cast<char>(rng());
    for (size_t b = 0; b < bytes.size(); b += l.block_bytes) {  // sane f16 scales
      const uint16_t h = FloatToHalf(1.0f / 1024);
      const size_t at = t.dtype == v1::DTYPE_Q6_K ? b + 208 : b;
      bytes[at] = static_cast<char>(h & 0xff);
      bytes[at + 1] = static_cast<char>(h >> 8);
      if (t.dtype == v1::DTYPE_Q4_K) bytes[b + 2] = bytes[at], bytes[b + 3] = bytes[at + 1];
    }
    kiln::testing::GgufWriter writer;
    writer.Str("general.architecture", "llama");
    writer.Tensor("blk.0.ffn_up.weight", {kK, kN}, t.ggml, bytes);
    const std::string path = ::testing::TempDir() + "/quant_engine_" + std::to_string(::getpid()) +
                             "_" + DTypeName(t.dtype) + ".gguf";
    {
      std::ofstream out(path, std::ios::binary);
      const std::string file = writer.Bytes();
      out.write(file.data(), static_cast<std::streamsize>(file.size()));
    }
    auto file = io::GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    auto w = file->Read("blk.0.ffn_up.weight");
    ::unlink(path.c_str());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_EQ(w->dtype(), t.dtype);
    ASSERT_EQ(w->dims(), (Dims{kN, kK}));

    const std::string text =
        absl::StrCat("input x: f32[2, ", kK, "]\nparam w: ", DTypeName(t.dtype), "[", kN, ", ", kK,
                     "]\n", "let y = dequant_matmul(x, w, transpose_b=true)\nout y");
    auto graph = ir::ParseGraphProto(text);
    ASSERT_TRUE(graph.ok()) << graph.status();
    std::vector<float> xv(2 * kK);
    for (int64_t i = 0; i < 2 * kK; ++i) xv[i] = static_cast<float>((i * 37) % 11 - 5) / 8;
    HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {2, kK}, xv);
    auto engine = Engine::Create(EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    const TensorRef param_refs[] = {TensorRef::Of("w", *w)};
    auto params = (*engine)->CreateParams(param_refs);
    ASSERT_TRUE(params.ok()) << params.status();
    const TensorRef inputs[] = {TensorRef::Of("x", x)};
    auto r = (*engine)->RunGraph(*graph, inputs, params->get(), {}, RunOptions{});
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<double> wd(kN * kK);
    quant::DequantizeBlocks(t.dtype, reinterpret_cast<const uint8_t*>(bytes.data()),
                            kN * kK / l.block_elems, wd.data());
    const HostTensor& y = r->outputs[0].second;
    for (int64_t m = 0; m < 2; ++m) {
      for (int64_t n = 0; n < kN; ++n) {
        double want = 0, scale = 0;
        for (int64_t k = 0; k < kK; ++k) {
          want += xv[m * kK + k] * wd[n * kK + k];
          scale += std::abs(xv[m * kK + k] * wd[n * kK + k]);
        }
        EXPECT_NEAR(y.data_as<float>()[m * kN + n], want, 1e-5 * scale + 1e-6)
            << DTypeName(t.dtype) << " " << m << "," << n;
      }
    }
  }
}

// CompileOptions.allow_int8_activations: its own executable (a key component),
// the CPU's DequantMatMul takes the int8 path (the dispatch report names it),
// also when the executable comes back from the disk cache, and the result stays
// within the derived budget of the exact product. Rounding x to x^ = d q with
// d = amax / 127 per group of g values (256 for q4_k / q5_k, 32 for the others)
// moves each value by at most d / 2 = amax / 254, so |y^ - y| <= sum_j |w_j|
// amax_b(j) / 254, amax_b(j) the largest |x| of j's group (docs/quantization.md).
TEST(QuantEngineTest, Int8ActivationsOwnKeyAndPathWithinDerivedBudget) {
  constexpr int64_t kK = 512, kN = 24;
  const std::string dir = ::testing::TempDir() + "/quant_engine_int8_" + std::to_string(::getpid());
  EngineOptions eo;
  eo.cache_dir = dir;
  eo.calibration = EngineOptions::Calibration::kNever;
  for (DType dtype : {v1::DTYPE_Q8_0, v1::DTYPE_Q4_0, v1::DTYPE_Q4_K, v1::DTYPE_Q5_K,
                      v1::DTYPE_Q6_K}) {
    SCOPED_TRACE(DTypeName(dtype));
    const DTypeLayout l = LayoutOf(dtype);
    HostTensor w = std::move(HostTensor::Create(dtype, {kN, kK})).value();
    uint8_t* wb = w.data_as<uint8_t>();
    std::mt19937 rng(7);
    for (int64_t i = 0; i < w.num_bytes(); ++i) wb[i] = static_cast<uint8_t>(rng());
    for (int64_t b = 0; b < w.num_bytes(); b += l.block_bytes) {  // f16 scales of sane size
      const uint16_t h = FloatToHalf(1.0f / 512);
      const int64_t at = dtype == v1::DTYPE_Q6_K ? b + 208 : b;
      wb[at] = h & 0xff, wb[at + 1] = h >> 8;
      if (dtype == v1::DTYPE_Q4_K || dtype == v1::DTYPE_Q5_K) wb[b + 2] = wb[at], wb[b + 3] = wb[at + 1];
    }
    std::vector<double> wd(kN * kK);
    quant::DequantizeBlocks(dtype, wb, kN * kK / l.block_elems, wd.data());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> xv(kK);
    for (float& v : xv) v = normal(rng);
    HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {1, kK}, xv);
    const std::string text =
        absl::StrCat("input x: f32[1, ", kK, "]\nparam w: ", DTypeName(dtype), "[", kN, ", ", kK,
                     "]\nlet y = dequant_matmul(x, w, transpose_b=true)\nout y");
    auto graph = ir::ParseGraphProto(text);
    ASSERT_TRUE(graph.ok()) << graph.status();

    CompileOptions exact_options, int8_options;
    exact_options.device = int8_options.device = "cpu:0";
    int8_options.allow_int8_activations = true;
    struct Got {
      std::string key, implementation;
      v1::CacheOutcome cache;
      std::vector<float> y;
    };
    // Compiles and runs on a fresh engine (the second one of a kind finds the
    // first one's executable on disk).
    auto run = [&](const CompileOptions& co) -> Got {
      auto engine = Engine::Create(eo);
      EXPECT_TRUE(engine.ok()) << engine.status();
      const TensorRef param_refs[] = {TensorRef::Of("w", w)};
      auto params = (*engine)->CreateParams(param_refs);
      EXPECT_TRUE(params.ok()) << params.status();
      auto compiled = (*engine)->Compile(*graph, co, {});
      EXPECT_TRUE(compiled.ok()) << compiled.status();
      const TensorRef inputs[] = {TensorRef::Of("x", x)};
      RunOptions ro;
      ro.report = true;
      auto r = (*engine)->Run(*compiled->executable, inputs, params->get(), ro);
      EXPECT_TRUE(r.ok()) << r.status();
      Got g{compiled->report.executable_key(), "", compiled->report.executable_cache(), {}};
      for (const auto& step : r->report.steps()) {
        if (step.implementation().find("dequant_matmul") != std::string::npos) g.implementation = step.implementation();
      }
      const HostTensor& y = r->outputs[0].second;
      g.y.assign(y.data_as<float>(), y.data_as<float>() + kN);
      return g;
    };
    const Got exact = run(exact_options), int8 = run(int8_options), again = run(int8_options);
    EXPECT_NE(exact.key, int8.key);
    EXPECT_EQ(exact.implementation.find("_int8_"), std::string::npos) << exact.implementation;
    EXPECT_NE(int8.implementation.find("_matvec_int8_"), std::string::npos) << int8.implementation;
    EXPECT_EQ(again.cache, v1::CACHE_HIT_DISK);
    EXPECT_EQ(again.implementation, int8.implementation);
    int moved = 0;
    for (int64_t n = 0; n < kN; ++n) {
      double want = 0, bound = 0, scale = 0;
      const int64_t g = dtype == v1::DTYPE_Q4_K || dtype == v1::DTYPE_Q5_K ? 256 : 32;
      for (int64_t b = 0; b < kK / g; ++b) {
        float amax = 0;
        for (int i = 0; i < g; ++i) amax = std::max(amax, std::fabs(xv[g * b + i]));
        for (int i = 0; i < g; ++i) {
          const int64_t j = g * b + i;
          want += xv[j] * wd[n * kK + j];
          bound += std::fabs(wd[n * kK + j]) * amax / 254;
          scale += std::fabs(xv[j] * wd[n * kK + j]);
        }
      }
      EXPECT_NEAR(exact.y[n], want, 1e-5 * scale + 1e-6) << n;
      // The bound, plus the f32 accumulation both sides share.
      EXPECT_NEAR(int8.y[n], want, bound * 1.001 + 1e-5 * scale + 1e-6) << n;
      EXPECT_EQ(again.y[n], int8.y[n]) << n;
      moved += int8.y[n] != exact.y[n];
    }
    EXPECT_GT(moved, 0) << "the int8 path computed the exact product";
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kiln
