// The quantization ops through the whole engine (parse, infer, legalize, plan,
// run on the CPU): a GGUF-style q8_0 weight as a param consumed by
// dequant_matmul and dequantize, and a quantize -> dequantize round trip. The
// kernels' arithmetic is the conformance suite's business; this checks that
// block-quantized params travel through compile and run intact.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/ir/text.h"

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

}  // namespace
}  // namespace kiln
