#include "backends/cpu/small_matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backends/cpu/parallel.h"

namespace kiln::cpu {

const char* SmallMatMulIsaName(SmallMatMulIsa isa) {
  return isa == SmallMatMulIsa::kAvx512 ? "avx512" : "avx2";
}

SmallMatMulIsa BestSmallMatMulIsa() {
  static const SmallMatMulIsa isa = [] {
    const char* off = std::getenv("KILN_CPU_NO_AVX512");
    if (off != nullptr && std::string_view(off) == "1") return SmallMatMulIsa::kAvx2;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
               ? SmallMatMulIsa::kAvx512
               : SmallMatMulIsa::kAvx2;
  }();
  return isa;
}

bool SmallMatMulEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("KILN_CPU_SMALL_MATMUL");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return enabled;
}

int64_t SmallMatMulMaxM(SmallMatMulIsa isa) {
  static const int64_t forced = [] {
    const char* v = std::getenv("KILN_CPU_SMALL_MATMUL_MAX_M");
    return v == nullptr ? int64_t{0} : static_cast<int64_t>(std::atoll(v));
  }();
  if (forced > 0) return forced;
  return isa == SmallMatMulIsa::kAvx512 ? kSmallMatMulLargeMaxM : kSmallMatMulMaxM;
}

bool SmallActOf(v1::UnaryKind kind, SmallAct* act) {
  switch (kind) {
    case v1::UNARY_KIND_UNSPECIFIED:
    case v1::UNARY_IDENTITY: *act = SmallAct::kNone; return true;
    case v1::UNARY_RELU: *act = SmallAct::kRelu; return true;
    case v1::UNARY_GELU: *act = SmallAct::kGelu; return true;
    case v1::UNARY_GELU_TANH: *act = SmallAct::kGeluTanh; return true;
    case v1::UNARY_SILU: *act = SmallAct::kSilu; return true;
    case v1::UNARY_SIGMOID: *act = SmallAct::kSigmoid; return true;
    case v1::UNARY_TANH: *act = SmallAct::kTanh; return true;
    default: return false;
  }
}

void PackBPanel(const float* b, int64_t k, int64_t n, int64_t panel, float* out) {
  const int64_t j0 = panel * kSmallPanel;
  const int64_t w = std::min(kSmallPanel, n - j0);
  for (int64_t kk = 0; kk < k; ++kk) {
    float* row = out + kk * kSmallPanel;
    std::memcpy(row, b + kk * n + j0, w * sizeof(float));
    std::fill(row + w, row + kSmallPanel, 0.0f);
  }
}

void PackB(const float* b, int64_t k, int64_t n, bool transposed, float* out) {
  const int64_t panels = (n + kSmallPanel - 1) / kSmallPanel;
  ParallelFor(panels, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, k * kSmallPanel)),
              [&](int64_t begin, int64_t end) {
                for (int64_t p = begin; p < end; ++p) {
                  float* dst = out + p * k * kSmallPanel;
                  if (!transposed) {
                    PackBPanel(b, k, n, p, dst);
                    continue;
                  }
                  // B is [n, k]: column j of the product is row j of b.
                  const int64_t j0 = p * kSmallPanel;
                  const int64_t w = std::min(kSmallPanel, n - j0);
                  std::fill(dst, dst + k * kSmallPanel, 0.0f);
                  for (int64_t j = 0; j < w; ++j) {
                    const float* src = b + (j0 + j) * k;
                    for (int64_t kk = 0; kk < k; ++kk) dst[kk * kSmallPanel + j] = src[kk];
                  }
                }
              });
}

void SmallMatMul(SmallMatMulIsa isa, const SmallMatMulArgs& args) {
  if (args.m <= 0 || args.n <= 0) return;
  const int64_t panels = (args.n + kSmallPanel - 1) / kSmallPanel;
  auto* run = isa == SmallMatMulIsa::kAvx512 ? &SmallMatMulAvx512 : &SmallMatMulAvx2;
  // A thread's share should be worth ~32k FMAs at least: below that the
  // OpenMP team's wake-up costs more than it saves (fc3 of the MLP, 512x10,
  // runs on one thread).
  const int64_t per_panel = std::max<int64_t>(1, args.m * std::max<int64_t>(args.k, 1) * kSmallPanel);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / per_panel);
  ParallelFor(panels, grain, [&](int64_t begin, int64_t end) { run(args, begin, end); });
}

}  // namespace kiln::cpu
