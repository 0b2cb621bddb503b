// Kiln's attention forward on cuda:0 (the backend's kernel, timed with its
// CUDA events: medians of timed batches after warm-up), for the issue's
// cases: bf16 B4 H32 S2048 D128 causal and B4 H32 S4096 full, and a decode
// case (Sq = 1 over a long cache, GQA), and f32 cases (`--cases f32`: the
// BERT-base layer's attention, B8 H12 S128 D64, and B4 H16 S512 D64: the
// tiled SIMT kernel). PyTorch SDPA is timed in the same
// device call by torch_attention.py; cuda_attention.sh prints the ratios.
// One JSON line per case: ms, TFLOP/s (4 B H Sq Sk D, halved under a causal
// mask; for decode GB/s of K and V read), the implementation, and the max
// |error| of 64 sampled rows against an f64 reference of the stored inputs.
// Where the device found cuDNN, each case runs twice: "impl": "kiln" is what
// the backend chooses (cudnn:sdpa_fwd_<dt> where cuDNN serves the shape),
// "impl": "kiln_own" a second device of the same GPU created with
// KILN_CUDNN=0 (Kiln's own kernels) where the choice was cuDNN, and
// "impl": "kiln_cudnn" (KILN_DECODE_ATTENTION=cudnn) where a decode case's
// choice was Kiln's kernel, and "impl": "kiln_own_fma" (KILN_DECODE_MMA=0, the
// 16-byte FMA kernel) where it was the tensor-core decode kernel, "impl":
// "kiln_own_mma" (KILN_DECODE_MMA=1) where it was the 16-byte kernel. --splits 4,8,16 times Kiln's decode kernel at each
// split count (KILN_DECODE_SPLITS, "impl": "kiln_own_split<n>") beside its own choice;
// --rings 4x3,1x8,2x5x4 its load ring at each <steps per pass>x<passes per ring>
// [x<blocks per SM for __launch_bounds__>] (KILN_DECODE_RING, "impl": "kiln_own_ring<...>").
//   attention_fwd [--device cuda:0] [--reps 10] [--rounds 7] [--cases all|big|decode|f32]
//                 [--splits n,n,...] [--rings SxP[xB],...]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "backends/backend.h"
#include "base/half.h"
#include "nlohmann/json.hpp"
#include "bench/gpu/bench_device.h"
#include "bench/gpu/bench_util.h"

namespace {

using json = nlohmann::json;
using kiln::DType;
namespace v1 = kiln::v1;

using kiln::bench::Median;

struct Case {
  std::string name;
  DType dt;
  int64_t B, Hq, Hkv, Sq, Sk, D;
  bool causal;
};

int64_t ElementBytes(DType dt) { return dt == v1::DTYPE_F32 ? 4 : 2; }

// Element i of `bytes` (f32, f16 or bf16) as a double.
double Value(DType dt, const std::vector<char>& bytes, int64_t i) {
  if (dt == v1::DTYPE_F32) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return dt == v1::DTYPE_F16 ? kiln::HalfToFloat(h) : kiln::Bf16ToFloat(h);
}

std::vector<char> Random(DType dt, int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<char> v(n * ElementBytes(dt));
  for (int64_t i = 0; i < n; ++i) {
    const float x = u(rng);
    if (dt == v1::DTYPE_F32) {
      std::memcpy(v.data() + 4 * i, &x, 4);
      continue;
    }
    const uint16_t h = dt == v1::DTYPE_F16 ? kiln::FloatToHalf(x) : kiln::FloatToBf16(x);
    std::memcpy(v.data() + 2 * i, &h, 2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_id = "cuda:0", which = "all", splits_arg, rings_arg;
  int reps = 10, rounds = 7;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) device_id = argv[i + 1];
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--cases") == 0) which = argv[i + 1];
    if (std::strcmp(argv[i], "--splits") == 0) splits_arg = argv[i + 1];
    if (std::strcmp(argv[i], "--rings") == 0) rings_arg = argv[i + 1];
  }
  std::vector<std::string> rings;
  for (absl::string_view part : absl::StrSplit(rings_arg, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> sp = absl::StrSplit(part, 'x');
    int steps = 0, passes = 0, min_blocks = 1;
    if ((sp.size() != 2 && sp.size() != 3) || !absl::SimpleAtoi(sp[0], &steps) ||
        !absl::SimpleAtoi(sp[1], &passes) || steps < 1 || steps > 8 || passes < 2 || passes > 8 ||
        (sp.size() == 3 &&
         (!absl::SimpleAtoi(sp[2], &min_blocks) || min_blocks < 1 || min_blocks > 16))) {
      std::fprintf(stderr,
                   "--rings takes <steps 1-8>x<passes 2-8>[x<blocks per SM 1-16>], not %s\n",
                   rings_arg.c_str());
      return 2;
    }
    rings.emplace_back(part);
  }
  std::vector<int> sweep;
  for (absl::string_view part : absl::StrSplit(splits_arg, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0) {
      std::fprintf(stderr, "--splits takes positive counts, not %s\n", splits_arg.c_str());
      return 2;
    }
    sweep.push_back(n);
  }
  if (reps <= 0 || rounds <= 0) return 2;
  std::vector<std::unique_ptr<kiln::backend::Backend>> backends;
  kiln::backend::Device* dev = kiln::bench::OpenDevice(device_id, &backends);
  if (dev == nullptr) {
    std::fprintf(stderr, "no device %s\n", device_id.c_str());
    return 1;
  }
  // The same GPU without cuDNN (Kiln's own kernels), timed beside the backend's choice.
  auto device_with = [&](const char* cudnn) -> kiln::backend::Device* {
    setenv("KILN_CUDNN", cudnn, 1);
    kiln::backend::Device* found = kiln::bench::OpenDevice(device_id, &backends);
    unsetenv("KILN_CUDNN");
    return found;
  };
  kiln::backend::Device* own = device_with("0");
  for (const std::string& f : dev->info().features) {
    if (f.rfind("cudnn-", 0) == 0) std::fprintf(stderr, "%s: %s\n", device_id.c_str(), f.c_str());
  }
  std::vector<Case> cases;
  if (which == "all" || which == "big") {
    cases.push_back({"causal_B4_H32_S2048_D128", v1::DTYPE_BF16, 4, 32, 32, 2048, 2048, 128, true});
    cases.push_back({"full_B4_H32_S4096_D128", v1::DTYPE_BF16, 4, 32, 32, 4096, 4096, 128, false});
    cases.push_back({"full_B16_H16_S2048_D64", v1::DTYPE_BF16, 16, 16, 16, 2048, 2048, 64, false});
    // The bf16 BERT-base layer's attention (B32 S512) and the 7B-style decoder layer's
    // with grouped KV heads.
    cases.push_back({"bert_bf16_B32_H12_S512_D64", v1::DTYPE_BF16, 32, 12, 12, 512, 512, 64, false});
    cases.push_back({"gqa_causal_B4_H32_KV8_S2048_D128", v1::DTYPE_BF16, 4, 32, 8, 2048, 2048, 128, true});
  }
  if (which == "all" || which == "decode") {
    cases.push_back({"decode_B8_H32_KV8_S1_Sk8192_D128", v1::DTYPE_BF16, 8, 32, 8, 1, 8192, 128, true});
    cases.push_back({"decode_B1_H32_S1_Sk32768_D128", v1::DTYPE_BF16, 1, 32, 32, 1, 32768, 128, true});
    cases.push_back({"decode_B4_H32_KV4_S1_Sk16384_D128", v1::DTYPE_BF16, 4, 32, 4, 1, 16384, 128, true});
  }
  if (which == "all" || which == "f32") {
    cases.push_back({"bert_f32_B8_H12_S128_D64", v1::DTYPE_F32, 8, 12, 12, 128, 128, 64, false});
    cases.push_back({"f32_B4_H16_S512_D64", v1::DTYPE_F32, 4, 16, 16, 512, 512, 64, false});
  }
  struct Inputs {
    std::vector<char> q, k, v;
    std::vector<double> want;  // the reference of the 64 sampled rows, [64][D]
  };
  std::map<std::string, Inputs> inputs;
  std::string last_impl;
  // Times `c` on `dev` (returns false on a failure); `label` is the JSON impl.
  auto measure = [&](const Case& c, kiln::backend::Device* target, const char* label) -> bool {
    kiln::backend::Device* dev = target;
    auto stream_or = dev->CreateStream();
    if (!stream_or.ok()) return false;
    auto& stream = *stream_or;
    kiln::backend::KernelSpec s;
    s.name = s.label = "bench_attention";
    s.op = v1::OP_ATTENTION;
    s.attrs.mutable_attention()->set_mask(c.causal ? v1::MASK_CAUSAL : v1::MASK_NONE);
    s.inputs = {{c.dt, {c.B, c.Hq, c.Sq, c.D}}, {c.dt, {c.B, c.Hkv, c.Sk, c.D}},
                {c.dt, {c.B, c.Hkv, c.Sk, c.D}}};
    s.outputs = {{c.dt, {c.B, c.Hq, c.Sq, c.D}}};
    kiln::backend::PrepareContext ctx;
    auto kernel = dev->PrepareKernel(s, ctx);
    if (!kernel.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), std::string(kernel.status().message()).c_str());
      return false;
    }
    const int64_t nq = c.B * c.Hq * c.Sq * c.D, nk = c.B * c.Hkv * c.Sk * c.D;
    // A case's inputs and reference are made once (a case may be timed several times).
    Inputs& in = inputs[c.name];
    if (in.q.empty()) {
      in.q = Random(c.dt, nq, 1, 1.0f), in.k = Random(c.dt, nk, 2, 1.0f), in.v = Random(c.dt, nk, 3, 1.0f);
    }
    const std::vector<char>&q = in.q, &k = in.k, &v = in.v;
    std::vector<std::unique_ptr<kiln::backend::Buffer>> bufs;
    std::vector<kiln::backend::BufferView> views;
    const int64_t es = ElementBytes(c.dt);
    for (const auto* h : {&q, &k, &v}) {
      auto b = dev->Allocate(static_cast<int64_t>(h->size()));
      if (!b.ok()) return false;
      bufs.push_back(std::move(b).value());
      views.push_back({bufs.back().get(), 0, static_cast<int64_t>(h->size())});
      if (!dev->CopyToDevice(*stream, h->data(), views.back()).ok()) return false;
    }
    auto ob = dev->Allocate(nq * es);
    if (!ob.ok()) return false;
    const std::vector<kiln::backend::BufferView> ins = views, outs = {{ob->get(), 0, nq * es}};
    auto launch = [&] { return (*kernel)->Launch(*stream, ins, outs).ok(); };
    for (int i = 0; i < 3; ++i) {
      if (!launch()) return false;
    }
    if (!stream->Synchronize().ok()) return false;
    std::vector<double> ms;
    for (int r = 0; r < rounds; ++r) {
      auto e0 = stream->Record();
      for (int i = 0; i < reps; ++i) {
        if (!launch()) return false;
      }
      auto e1 = stream->Record();
      if (!e0.ok() || !e1.ok() || !stream->Synchronize().ok()) return false;
      auto us = (*e1)->MicrosSince(**e0);
      if (!us.ok()) return false;
      ms.push_back(*us / 1000.0 / reps);
    }
    std::vector<char> out(nq * es);
    if (!dev->CopyToHost(*stream, outs[0], out.data()).ok() || !stream->Synchronize().ok()) return false;
    // 64 sampled rows against an f64 reference.
    double worst = 0;
    std::mt19937_64 rng(9);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    const bool have_reference = !in.want.empty();
    for (int t = 0; t < 64; ++t) {
      const int64_t row = static_cast<int64_t>(rng() % (c.B * c.Hq * c.Sq));
      if (have_reference) {
        for (int64_t d = 0; d < c.D; ++d) {
          worst = std::max(worst, std::fabs(in.want[t * c.D + d] - Value(c.dt, out, row * c.D + d)));
        }
        continue;
      }
      const int64_t i = row % c.Sq, h = (row / c.Sq) % c.Hq, b = row / (c.Sq * c.Hq);
      const int64_t hk = h / (c.Hq / c.Hkv);
      const int64_t hi = c.causal ? i + (c.Sk - c.Sq) + 1 : c.Sk;
      std::vector<double> p(hi);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < hi; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          dot += Value(c.dt, q, row * c.D + d) * Value(c.dt, k, ((b * c.Hkv + hk) * c.Sk + j) * c.D + d);
        }
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < c.D; ++d) {
        double want = 0;
        for (int64_t j = 0; j < hi; ++j) want += p[j] * Value(c.dt, v, ((b * c.Hkv + hk) * c.Sk + j) * c.D + d);
        in.want.push_back(want / sum);
        worst = std::max(worst, std::fabs(want / sum - Value(c.dt, out, row * c.D + d)));
      }
    }
    const double med = Median(ms);
    double flops = 4.0 * c.B * c.Hq * c.Sq * c.Sk * c.D;
    if (c.causal && c.Sq == c.Sk) flops /= 2;
    json j = {{"bench", "attention_fwd"}, {"impl", label}, {"case", c.name},
              {"implementation", (*kernel)->implementation()}, {"ms", med},
              {"tflops", flops / (med * 1e-3) / 1e12}, {"max_abs_err", worst}};
    if (c.Sq == 1) j["kv_gbps"] = 2.0 * nk * es / (med * 1e-3) / 1e9;
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    last_impl = (*kernel)->implementation();
    return true;
  };
  // Runs `fn` with the environment variable `name` set to `value` (read at prepare).
  auto with_env = [](const char* name, const std::string& value, const std::function<bool()>& fn) {
    setenv(name, value.c_str(), 1);
    const bool ok = fn();
    unsetenv(name);
    return ok;
  };
  for (const Case& c : cases) {
    if (!measure(c, dev, "kiln")) return 1;
    const std::string chosen = last_impl;  // the later measures overwrite last_impl
    if (last_impl.rfind("cudnn:", 0) == 0 && own != nullptr && !measure(c, own, "kiln_own")) {
      return 1;
    }
    const bool own_decode = last_impl.find("decode16") != std::string::npos ||
                            last_impl.find("decode_mma") != std::string::npos;
    if (c.Sq == 1 && own_decode &&
        !with_env("KILN_DECODE_ATTENTION", "cudnn", [&] { return measure(c, dev, "kiln_cudnn"); })) {
      return 1;
    }
    // The tensor-core decode kernel's shapes on the 16-byte kernel, and the
    // 16-byte kernel's on the tensor-core one.
    if (c.Sq == 1 && own != nullptr && chosen.find("decode_mma") != std::string::npos &&
        !with_env("KILN_DECODE_MMA", "0", [&] { return measure(c, own, "kiln_own_fma"); })) {
      return 1;
    }
    if (c.Sq == 1 && own != nullptr && chosen.find("decode16") != std::string::npos &&
        !with_env("KILN_DECODE_MMA", "1", [&] { return measure(c, own, "kiln_own_mma"); })) {
      return 1;
    }
    if (c.Sq != 1 || own == nullptr) continue;
    for (int n : sweep) {
      const std::string label = "kiln_own_split" + std::to_string(n);
      if (!with_env("KILN_DECODE_SPLITS", std::to_string(n),
                    [&] { return measure(c, own, label.c_str()); })) {
        return 1;
      }
    }
    for (const std::string& r : rings) {
      const std::string label = "kiln_own_ring" + r;
      if (!with_env("KILN_DECODE_RING", r, [&] { return measure(c, own, label.c_str()); })) {
        return 1;
      }
    }
  }
  return 0;
}
