// DequantMatMul on the CPU: f32/f16/bf16 activations [..., M, K] times a
// block-quantized weight (q8_0, q4_0, q4_k, q5_k, q6_k in GGUF's layout),
// stored [N, K] (transpose_b, as GGUF stores a linear layer) or [K, N]; the
// result is [..., M, N] in the activations' dtype. The leading dims fold into
// M (the weight is shared).
//
// Paths, chosen at build time from M:
// - [N, K], M <= kDotBatch (decode, small batches): each thread takes a range
//   of weight rows and streams them once; every block is decoded in registers
//   and multiplied into up to kMaxDotRows activation rows at a time
//   (dequant_dot.h). A tile of kRowTile weight rows stays in L1/L2 while the
//   activation rows go past it in groups of eight.
// - [N, K], M > kDotBatch: each thread decodes panels of its weight rows to f32
//   (about kPanelBytes) and multiplies them with oneDNN's sgemm.
// - [K, N]: the blocks run along N, so each thread takes a range of column
//   chunks; small M accumulates decoded rows into a register-sized tile of
//   outputs (axpy), large M decodes K x chunk panels for sgemm.
// All accumulate in f32; f16/bf16 activations and results are converted
// around the f32 compute.
// With KernelSpec.allow_int8_activations (CompileOptions.allow_int8_activations),
// the [N, K] streaming path (M <= kDotBatch) rounds the activation rows to int8
// per 32 values once per call and multiplies in integers (dequant_dot.h, "Int8
// activations": AVX-512 VNNI, AVX2 or portable); the other paths stay f32.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/dequant_dot.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/parallel.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "oneapi/dnnl/dnnl.h"

namespace kiln::cpu {
namespace {

using backend::BufferView;
using backend::Claim;
using backend::KernelSpec;
using backend::TensorDesc;

constexpr int64_t kDotBatch = 16;         // largest M on the streaming dot path
constexpr int64_t kRowTile = 16;          // weight rows kept hot across row groups
constexpr int64_t kPanelBytes = 1 << 20;  // f32 weights decoded per sgemm panel
constexpr int64_t kColumnChunk = 256;     // [K, N]: columns per work item

// A claim's reason (legalize and PrepareKernel prefix the node's label).
template <typename... Args>
absl::Status Bad(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

absl::Status Arity(const KernelSpec& spec, size_t lo, size_t hi) {
  if (spec.inputs.size() < lo || spec.inputs.size() > hi || spec.outputs.size() != 1) {
    return Bad("expects ", lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "..", hi),
               " operands and 1 result, got ", spec.inputs.size(), " and ", spec.outputs.size());
  }
  return absl::OkStatus();
}

absl::Status Output(const KernelSpec& spec, DType dtype, const Dims& dims) {
  const TensorDesc& o = spec.outputs[0];
  if (o.dtype != dtype || o.dims != dims) {
    return Bad("result is ", TypeString(o), " but the op computes ", DTypeName(dtype),
               DimsToString(dims));
  }
  return absl::OkStatus();
}

struct Plan {
  DType act = v1::DTYPE_F32;  // activation and result storage
  DType wtype = v1::DTYPE_Q8_0;
  bool transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t block_elems = 0, block_bytes = 0;
  int64_t row_bytes = 0;   // bytes of one stored weight row (K of them for [K, N])
  int64_t panel_rows = 0;  // [N, K]: weight rows per panel; [K, N]: K rows per panel
  bool int8 = false;       // int8 activations on the streaming path
};

absl::StatusOr<Plan> Validate(const KernelSpec& spec) {
  if (auto s = Arity(spec, 2, 2); !s.ok()) return s;
  const backend::TensorDesc& x = spec.inputs[0];
  const backend::TensorDesc& w = spec.inputs[1];
  Plan p;
  p.act = x.dtype;
  p.wtype = w.dtype;
  p.transpose_b = spec.attrs.dequant_matmul().transpose_b();
  if (!IsF32Storage(x.dtype)) {
    return Bad("activations must be f32, f16 or bf16, got ", TypeString(x));
  }
  if (!IsQuantized(w.dtype)) {
    return Bad("weights must be block-quantized (q8_0, q4_0, q4_k, q5_k, q6_k), got ",
               TypeString(w));
  }
  if (x.rank() < 1 || w.rank() != 2) {
    return Bad("expects activations [..., K] and a weight [N, K] or [K, N], got ", TypeString(x),
               " and ", TypeString(w));
  }
  const DTypeLayout layout = LayoutOf(w.dtype);
  p.block_elems = layout.block_elems;
  p.block_bytes = layout.block_bytes;
  p.k = x.dims.back();
  p.n = p.transpose_b ? w.dims[0] : w.dims[1];
  const int64_t wk = p.transpose_b ? w.dims[1] : w.dims[0];
  if (wk != p.k) {
    return Bad("K differs: activations ", TypeString(x), ", weight ", TypeString(w),
               p.transpose_b ? " (transpose_b: [N, K])" : " ([K, N])");
  }
  const int64_t row = w.dims[1];
  if (row % p.block_elems != 0) {
    return Bad("weight ", TypeString(w), ": its rows of ", row, " elements are not whole ",
               p.block_elems, "-element ", DTypeName(w.dtype), " blocks");
  }
  CheckedInt m = 1;
  for (size_t i = 0; i + 1 < x.dims.size(); ++i) m = m * x.dims[i];
  const CheckedInt row_bytes = CheckedInt(row / p.block_elems) * p.block_bytes;
  const CheckedInt w_bytes = row_bytes * w.dims[0];
  const CheckedInt io = m * p.k + m * p.n;
  const CheckedInt panel = CheckedInt(kRowTile) * p.k * 4;
  if (!m.ok() || !w_bytes.ok() || !io.ok() || !panel.ok() || !(io * 4).ok()) {
    return Bad("sizes overflow int64: ", TypeString(x), " @ ", TypeString(w));
  }
  p.m = m.get();
  p.row_bytes = row_bytes.get();
  Dims want(x.dims.begin(), x.dims.end() - 1);
  want.push_back(p.n);
  if (auto s = Output(spec, x.dtype, want); !s.ok()) return s;
  p.int8 = spec.allow_int8_activations && p.transpose_b && p.m <= kDotBatch;
  if (p.transpose_b) {
    p.panel_rows = std::max<int64_t>(kRowTile, kPanelBytes / std::max<int64_t>(p.k * 4, 1));
  } else {
    p.panel_rows = std::max<int64_t>(1, kPanelBytes / (kColumnChunk * 4));
  }
  return p;
}

Claim SupportsDequantMatMul(const KernelSpec& spec) {
  auto p = Validate(spec);
  if (!p.ok()) return Claim::No(std::string(p.status().message()));
  return Claim::Yes();
}

class DequantMatMulKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const KernelSpec& spec) {
    auto v = Validate(spec);
    if (!v.ok()) return SpecError(spec, v.status().message());
    const Plan p = *v;
    auto kernel = std::unique_ptr<DequantMatMulKernel>(new DequantMatMulKernel(spec, p));
    if (p.act != v1::DTYPE_F32) {
      kernel->x32_.resize(p.m * p.k);
      kernel->y32_.resize(p.m * p.n);
    }
    return std::unique_ptr<backend::Kernel>(std::move(kernel));
  }

  std::string implementation() const override {
    const char* path = !plan_.transpose_b     ? (plan_.m <= kDotBatch ? "kn_axpy" : "kn_sgemm")
                       : plan_.m == 1         ? "matvec"
                       : plan_.m <= kDotBatch ? "small_batch"
                                              : "panel_sgemm";
    if (plan_.int8) {
      return absl::StrCat("kiln:dequant_matmul_", DTypeName(plan_.wtype), "_", path, "_int8_",
                          int8_.isa);
    }
    return absl::StrCat("kiln:dequant_matmul_", DTypeName(plan_.wtype), "_", path, "_",
                        kernels_.isa);
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    if (auto s = CheckViews(spec_, inputs, outputs); !s.ok()) return s;
    const Plan& p = plan_;
    if (p.m == 0 || p.n == 0) return absl::OkStatus();
    const float* x = static_cast<const float*>(HostPtr(inputs[0]));
    const uint8_t* w = static_cast<const uint8_t*>(HostPtr(inputs[1]));
    float* y = static_cast<float*>(outputs[0].host());
    nested_ = omp_in_parallel();
    if (p.act != v1::DTYPE_F32) {
      if (p.k > 0) ParallelConvertToF32(p.act, x, x32_.data(), p.m * p.k);
      x = x32_.data();
      y = y32_.data();
    }
    if (p.k == 0) {
      std::fill(y, y + p.m * p.n, 0.0f);
    } else if (p.int8) {
      RunInt8(w, x, y);
    } else if (p.transpose_b) {
      RunNK(w, x, y);
    } else {
      RunKN(w, x, y);
    }
    if (p.act != v1::DTYPE_F32) ParallelConvertFromF32(y, p.act, outputs[0].host(), p.m * p.n);
    return absl::OkStatus();
  }

 private:
  DequantMatMulKernel(const KernelSpec& spec, const Plan& p)
      : spec_(spec), plan_(p), kernels_(dq::Best()), int8_(dq::BestInt8()) {}

  // Per-thread scratch of `floats` each, indexed by Slot().
  float* Scratch(int64_t floats) {
    const int64_t threads = omp_get_max_threads();
    if (static_cast<int64_t>(scratch_.size()) < threads * floats) scratch_.resize(threads * floats);
    return scratch_.data();
  }

  // This thread's scratch slot inside ParallelFor. Launched from within an
  // enclosing parallel region, ParallelFor runs inline on the one calling
  // thread (Launch is not reentrant), whose team number may exceed the slots.
  int64_t Slot() const { return nested_ ? 0 : omp_get_thread_num(); }

  void RunNK(const uint8_t* w, const float* x, float* y) {
    const Plan& p = plan_;
    if (p.m <= dq::kMaxDotRows) {
      // One call per thread for its whole range: a kernel's per-call work
      // (the AVX2 k-quant loop's activation sums) is done once.
      ParallelFor(p.n, kRowTile, [&](int64_t n0, int64_t n1) {
        kernels_.dot_rows(p.wtype, w, p.row_bytes, n0, n1, p.k, x, p.k, static_cast<int>(p.m), y, p.n);
      });
      return;
    }
    if (p.m <= kDotBatch) {
      ParallelFor(p.n, kRowTile, [&](int64_t n0, int64_t n1) {
        for (int64_t t = n0; t < n1; t += kRowTile) {
          const int64_t t1 = std::min(n1, t + kRowTile);
          for (int64_t r = 0; r < p.m; r += dq::kMaxDotRows) {
            const int rows = static_cast<int>(std::min<int64_t>(dq::kMaxDotRows, p.m - r));
            kernels_.dot_rows(p.wtype, w, p.row_bytes, t, t1, p.k, x + r * p.k, p.k, rows,
                              y + r * p.n, p.n);
          }
        }
      });
      return;
    }
    const int64_t per_thread = p.panel_rows * p.k;
    float* scratch = Scratch(per_thread);
    const int64_t blocks_per_row = p.k / p.block_elems;
    ParallelFor(p.n, kRowTile, [&](int64_t n0, int64_t n1) {
      float* panel = scratch + Slot() * per_thread;
      for (int64_t t = n0; t < n1; t += p.panel_rows) {
        const int64_t nb = std::min(n1 - t, p.panel_rows);
        // Rows are contiguous, so a panel is one run of blocks.
        kernels_.decode(p.wtype, w + t * p.row_bytes, nb * blocks_per_row, panel);
        dnnl_sgemm('N', 'T', p.m, nb, p.k, 1.0f, x, p.k, panel, p.k, 0.0f, y + t, p.n);
      }
    });
  }

  // The activation rows are rounded once (in groups of kMaxDotRows), then the
  // threads split the weight rows; each weight row is read from memory once
  // and multiplied by every row of its group from L1.
  void RunInt8(const uint8_t* w, const float* x, float* y) {
    const Plan& p = plan_;
    for (int64_t r = 0; r < p.m; r += dq::kMaxDotRows) {
      const int rows = static_cast<int>(std::min<int64_t>(dq::kMaxDotRows, p.m - r));
      dq::QuantizeRows(p.wtype, x + r * p.k, p.k, rows, p.k, int8_.paired, xq_);
      ParallelFor(p.n, kRowTile, [&](int64_t n0, int64_t n1) {
        int8_.dot_rows(w, p.row_bytes, n0, n1, xq_, y + r * p.n, p.n);
      });
    }
  }

  void RunKN(const uint8_t* w, const float* x, float* y) {
    const Plan& p = plan_;
    const int64_t chunks = (p.n + kColumnChunk - 1) / kColumnChunk;
    const bool small = p.m <= kDotBatch;
    const int64_t per_thread = small ? (p.m + 1) * kColumnChunk : p.panel_rows * kColumnChunk;
    float* scratch = Scratch(per_thread);
    ParallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
      float* mine = scratch + Slot() * per_thread;
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t col = c * kColumnChunk;
        const int64_t width = std::min(kColumnChunk, p.n - col);  // whole blocks
        const int64_t blocks = width / p.block_elems;
        const uint8_t* base = w + (col / p.block_elems) * p.block_bytes;
        if (small) {
          float* decoded = mine;
          float* acc = mine + kColumnChunk;  // [m][kColumnChunk]
          std::fill(acc, acc + p.m * kColumnChunk, 0.0f);
          for (int64_t kk = 0; kk < p.k; ++kk) {
            kernels_.decode(p.wtype, base + kk * p.row_bytes, blocks, decoded);
            for (int64_t r = 0; r < p.m; ++r) {
              const float a = x[r * p.k + kk];
              float* out = acc + r * kColumnChunk;
              for (int64_t j = 0; j < width; ++j) out[j] += a * decoded[j];
            }
          }
          for (int64_t r = 0; r < p.m; ++r) {
            std::memcpy(y + r * p.n + col, acc + r * kColumnChunk, width * sizeof(float));
          }
          continue;
        }
        for (int64_t k0 = 0; k0 < p.k; k0 += p.panel_rows) {
          const int64_t kc = std::min(p.panel_rows, p.k - k0);
          for (int64_t kk = 0; kk < kc; ++kk) {
            kernels_.decode(p.wtype, base + (k0 + kk) * p.row_bytes, blocks,
                            mine + kk * kColumnChunk);
          }
          dnnl_sgemm('N', 'N', p.m, width, kc, 1.0f, x + k0, p.k, mine, kColumnChunk,
                     k0 == 0 ? 0.0f : 1.0f, y + col, p.n);
        }
      }
    });
  }

  KernelSpec spec_;
  Plan plan_;
  const dq::Kernels& kernels_;
  const dq::Int8Kernels& int8_;
  dq::Int8Rows xq_;  // the int8 activation rows of the current launch
  // Scratch reused by every launch (Launch is not reentrant).
  std::vector<float> x32_, y32_, scratch_;
  bool nested_ = false;  // this launch runs inside an enclosing parallel region
};

const CpuOpRegistration kRegistration({
    {v1::OP_DEQUANT_MATMUL, &SupportsDequantMatMul, &DequantMatMulKernel::Create},
});

}  // namespace
}  // namespace kiln::cpu
