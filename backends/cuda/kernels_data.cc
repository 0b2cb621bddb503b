// Data movement: Transpose, Slice, Expand, Concat (kernels/strided_copy.cu),
// Reshape and Copy (device-to-device copies), Gather (kernels/gather.cu), Pad (kernels/pad.cu).
// They move bytes without looking at them, so they serve every dense dtype of 1, 2, 4 or 8 bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/half.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

constexpr int kMaxRank = 8;

// strided_copy.cu's parameter block (passed by value).
struct StridedParams {
  int64_t count = 0, rank = 0, src_base = 0, dst_base = 0;
  int64_t dims[kMaxRank] = {}, src[kMaxRank] = {}, dst[kMaxRank] = {};
};

// A strided copy before simplification: element strides per dim of `dims`.
struct StridedCopy {
  std::vector<int64_t> dims, src, dst;
  int64_t src_base = 0, dst_base = 0;
};

// Drops size-1 dims and merges neighbours that are contiguous on both sides.
StridedCopy Simplify(const StridedCopy& c) {
  StridedCopy out;
  out.src_base = c.src_base;
  out.dst_base = c.dst_base;
  for (size_t k = 0; k < c.dims.size(); ++k) {
    if (c.dims[k] == 1) continue;
    if (!out.dims.empty() && out.src.back() == c.src[k] * c.dims[k] &&
        out.dst.back() == c.dst[k] * c.dims[k]) {
      out.dims.back() *= c.dims[k];
      out.src.back() = c.src[k];
      out.dst.back() = c.dst[k];
      continue;
    }
    out.dims.push_back(c.dims[k]);
    out.src.push_back(c.src[k]);
    out.dst.push_back(c.dst[k]);
  }
  return out;
}

absl::StatusOr<StridedParams> ToParams(const StridedCopy& raw) {
  const StridedCopy c = Simplify(raw);
  if (c.dims.size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", c.dims.size(), " after merging dims"));
  }
  StridedParams p;
  p.rank = static_cast<int64_t>(c.dims.size());
  p.src_base = c.src_base;
  p.dst_base = c.dst_base;
  p.count = 1;
  for (size_t k = 0; k < c.dims.size(); ++k) {
    p.dims[k] = c.dims[k];
    p.src[k] = c.src[k];
    p.dst[k] = c.dst[k];
    p.count *= c.dims[k];
  }
  return p;
}

// The copies a spec performs: one per input (concat) or one (the rest).
absl::StatusOr<std::vector<StridedCopy>> PlanCopies(const KernelSpec& spec) {
  const backend::TensorDesc& out = spec.outputs[0];
  const std::vector<int64_t> out_strides = RowMajorStrides(out.dims);
  std::vector<StridedCopy> copies;
  switch (spec.op) {
    case v1::OP_TRANSPOSE: {
      const auto& perm = spec.attrs.transpose().perm();
      const Dims& in = spec.inputs[0].dims;
      const std::vector<int64_t> in_strides = RowMajorStrides(in);
      if (perm.size() != static_cast<int>(in.size()) || out.dims.size() != in.size()) {
        return absl::InvalidArgumentError("perm does not match the input rank");
      }
      StridedCopy c;
      c.dims = out.dims;
      c.dst = out_strides;
      for (int64_t p : perm) {
        if (p < 0 || p >= static_cast<int64_t>(in.size())) {
          return absl::InvalidArgumentError("perm out of range");
        }
        c.src.push_back(in_strides[p]);
      }
      copies.push_back(std::move(c));
      break;
    }
    case v1::OP_SLICE: {
      const auto& a = spec.attrs.slice();
      const Dims& in = spec.inputs[0].dims;
      if (out.dims.size() != in.size()) return absl::InvalidArgumentError("rank changes");
      const std::vector<int64_t> in_strides = RowMajorStrides(in);
      StridedCopy c;
      c.dims = out.dims;
      c.dst = out_strides;
      c.src = in_strides;
      const int n = a.axes().empty() ? static_cast<int>(in.size()) : a.axes_size();
      if (a.start_size() < n || (!a.step().empty() && a.step_size() < n)) {
        return absl::InvalidArgumentError("start/step lists are shorter than the axes");
      }
      for (int i = 0; i < n; ++i) {
        int64_t axis = a.axes().empty() ? i : a.axes(i);
        if (axis < 0) axis += static_cast<int64_t>(in.size());
        if (axis < 0 || axis >= static_cast<int64_t>(in.size())) {
          return absl::InvalidArgumentError("axis out of range");
        }
        const int64_t dim = in[axis];
        int64_t start = a.start(i);
        if (start < 0) start += dim;
        start = std::clamp<int64_t>(start, 0, dim);
        const int64_t step = a.step().empty() ? 1 : a.step(i);
        if (step < 1) return absl::InvalidArgumentError("step < 1");
        if (out.dims[axis] > 0) c.src_base += start * in_strides[axis];
        c.src[axis] = in_strides[axis] * step;
      }
      copies.push_back(std::move(c));
      break;
    }
    case v1::OP_EXPAND: {
      const Dims& in = spec.inputs[0].dims;
      if (in.size() > out.dims.size()) return absl::InvalidArgumentError("rank shrinks");
      const std::vector<int64_t> in_strides = RowMajorStrides(in);
      const size_t off = out.dims.size() - in.size();
      StridedCopy c;
      c.dims = out.dims;
      c.dst = out_strides;
      c.src.assign(out.dims.size(), 0);
      for (size_t k = 0; k < in.size(); ++k) c.src[off + k] = in[k] == 1 ? 0 : in_strides[k];
      copies.push_back(std::move(c));
      break;
    }
    case v1::OP_CONCAT: {
      int64_t axis = spec.attrs.concat().axis();
      if (axis < 0) axis += static_cast<int64_t>(out.dims.size());
      if (axis < 0 || axis >= static_cast<int64_t>(out.dims.size())) {
        return absl::InvalidArgumentError("axis out of range");
      }
      int64_t at = 0;
      for (const backend::TensorDesc& in : spec.inputs) {
        if (in.dims.size() != out.dims.size()) return absl::InvalidArgumentError("ranks differ");
        StridedCopy c;
        c.dims = in.dims;
        c.src = RowMajorStrides(in.dims);
        c.dst = out_strides;
        c.dst_base = at * out_strides[axis];
        at += in.dims[axis];
        copies.push_back(std::move(c));
      }
      break;
    }
    default:
      return absl::InternalError("not a strided-copy op");
  }
  return copies;
}

Claim MovableDType(const KernelSpec& spec, const char* op) {
  for (const auto& t : spec.inputs) {
    if (t.dtype != spec.outputs[0].dtype) {
      return Claim::No(absl::StrCat("cuda ", op, ": dtypes differ"));
    }
  }
  const DType d = spec.outputs[0].dtype;
  const int64_t size = ElementSize(d);
  if (IsQuantized(d) || (size != 1 && size != 2 && size != 4 && size != 8)) {
    return Claim::No(absl::StrCat("cuda ", op, " moves dense types only, not ", DTypeName(d)));
  }
  return Claim::Yes();
}

std::string OpName(const KernelSpec& spec) {
  return absl::AsciiStrToLower(v1::OpKind_Name(spec.op).substr(3));
}

Claim SupportsStrided(const CudaDevice&, const KernelSpec& spec) {
  if (spec.outputs.size() != 1 || spec.inputs.empty()) return Claim::No("malformed spec");
  if (spec.op != v1::OP_CONCAT && spec.inputs.size() != 1) return Claim::No("malformed spec");
  const std::string op = OpName(spec);
  if (Claim c = MovableDType(spec, op.c_str()); !c.native) return c;
  absl::StatusOr<std::vector<StridedCopy>> copies = PlanCopies(spec);
  if (!copies.ok()) {
    return Claim::No(absl::StrCat("cuda ", op, ": ", copies.status().message()));
  }
  for (const StridedCopy& c : *copies) {
    if (!ToParams(c).ok()) {
      return Claim::No(absl::StrCat("cuda ", op, " handles up to ", kMaxRank,
                                    " dims after merging contiguous ones"));
    }
  }
  return Claim::Yes();
}

// The copy `p` of `element`-byte elements as a copy of 16-byte vectors, when
// its innermost run is contiguous on both sides and every extent and offset
// is a whole number of vectors (the head transposes around attention: rows
// of D = 64 / 128 bf16 move as 8 / 16 vectors); nullopt otherwise.
std::optional<StridedParams> WidenTo16Bytes(const StridedParams& p, int64_t element) {
  if (p.rank < 1 || element >= 16 || 16 % element != 0) return std::nullopt;
  const int64_t v = 16 / element;
  const int64_t last = p.rank - 1;
  if (p.src[last] != 1 || p.dst[last] != 1 || p.dims[last] % v != 0 || p.src_base % v != 0 ||
      p.dst_base % v != 0) {
    return std::nullopt;
  }
  StridedParams w = p;
  for (int64_t k = 0; k < last; ++k) {
    if (p.src[k] % v != 0 || p.dst[k] % v != 0) return std::nullopt;
    w.src[k] = p.src[k] / v;
    w.dst[k] = p.dst[k] / v;
  }
  w.dims[last] = p.dims[last] / v;
  w.src_base = p.src_base / v;
  w.dst_base = p.dst_base / v;
  w.count = p.count / v;
  return w;
}

class StridedCopyKernel final : public CudaKernel {
 public:
  StridedCopyKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, LoadedFunction wide,
                    std::vector<StridedParams> params,
                    std::vector<std::optional<StridedParams>> wide_params, std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        fn_(std::move(fn)),
        wide_(std::move(wide)),
        params_(std::move(params)),
        wide_params_(std::move(wide_params)) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      StridedParams p = params_[i];
      if (p.count == 0 || spec_.inputs[i].num_elements() == 0) continue;
      CUdeviceptr src = in[i], dst = out[0];
      CUfunction fn = fn_.fn;
      if (wide_params_[i].has_value() && ((src | dst) & 15) == 0) {
        p = *wide_params_[i];
        fn = wide_.fn;
      }
      void* args[] = {&src, &dst, &p};
      KILN_RETURN_IF_ERROR(
          LaunchKernel(s, fn, GridFor(device_.caps(), p.count, 256), 1, 1, 256, 0, args));
    }
    return absl::OkStatus();
  }

 private:
  LoadedFunction fn_, wide_;
  std::vector<StridedParams> params_;
  std::vector<std::optional<StridedParams>> wide_params_;  // per copy: as 16-byte vectors
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateStrided(CudaDevice& d,
                                                               const KernelSpec& spec,
                                                               backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(std::vector<StridedCopy> copies, PlanCopies(spec));
  std::vector<StridedParams> params;
  std::vector<std::optional<StridedParams>> wide_params;
  const DType dt = spec.outputs[0].dtype;
  bool any_wide = false;
  for (const StridedCopy& c : copies) {
    KILN_ASSIGN_OR_RETURN(StridedParams p, ToParams(c));
    params.push_back(p);
    wide_params.push_back(WidenTo16Bytes(p, ElementSize(dt)));
    any_wide |= wide_params.back().has_value();
  }
  // 32-bit indexing where every element offset of every tensor fits.
  int64_t largest = spec.outputs[0].num_elements();
  for (const auto& t : spec.inputs) largest = std::max(largest, t.num_elements());
  const bool narrow = largest < (int64_t{1} << 32);
  KILN_ASSIGN_OR_RETURN(
      LoadedFunction fn,
      LoadFunction(
          d, "strided_copy", KernelSource("strided_copy.cu"),
          absl::StrCat(narrow ? "kiln_strided_copy32_e" : "kiln_strided_copy_e", ElementSize(dt)),
          context));
  LoadedFunction wide;
  if (any_wide) {
    KILN_ASSIGN_OR_RETURN(
        wide, LoadFunction(d, "strided_copy", KernelSource("strided_copy.cu"),
                           narrow ? "kiln_strided_copy32_e16" : "kiln_strided_copy_e16", context));
  }
  return std::unique_ptr<backend::Kernel>(std::make_unique<StridedCopyKernel>(
      d, spec, std::move(fn), std::move(wide), std::move(params), std::move(wide_params),
      absl::StrCat("nvrtc:", OpName(spec), "_", DTypeSuffix(dt))));
}

// Reshape and Copy: the bytes are already in order; one device copy.
class ByteCopyKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    if (in[0] == out[0]) return absl::OkStatus();  // planned in place
    return device_.Check(
        Driver().cuMemcpyDtoDAsync(out[0], in[0], static_cast<size_t>(spec_.outputs[0].num_bytes()),
                                   s.stream()),
        "cuMemcpyDtoDAsync");
  }
};

Claim SupportsByteCopy(const CudaDevice&, const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) return Claim::No("malformed spec");
  if (spec.inputs[0].num_bytes() != spec.outputs[0].num_bytes()) {
    return Claim::No("cuda copy: input and output sizes differ");
  }
  return MovableDType(spec, "copy");
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateByteCopy(CudaDevice& d,
                                                                const KernelSpec& spec,
                                                                backend::PrepareContext&) {
  const char* what = spec.op == v1::OP_RESHAPE ? "reshape" : "copy";
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<ByteCopyKernel>(d, spec, absl::StrCat("cuda:memcpy_", what)));
}

// ---- Gather ----

Claim SupportsGather(const CudaDevice&, const KernelSpec& spec) {
  if (spec.inputs.size() != 2 || spec.outputs.size() != 1) return Claim::No("malformed spec");
  const DType it = spec.inputs[1].dtype;
  if (it != v1::DTYPE_I32 && it != v1::DTYPE_I64 && it != v1::DTYPE_I16 && it != v1::DTYPE_I8 &&
      it != v1::DTYPE_U8) {
    return Claim::No(absl::StrCat("cuda gather reads integer indices, not ", DTypeName(it)));
  }
  const Dims& data = spec.inputs[0].dims;
  int64_t axis = spec.attrs.gather().axis();
  if (axis < 0) axis += static_cast<int64_t>(data.size());
  if (axis < 0 || axis >= static_cast<int64_t>(data.size())) {
    return Claim::No("cuda gather: axis out of range");
  }
  if (spec.outputs[0].dtype != spec.inputs[0].dtype) return Claim::No("cuda gather: dtypes differ");
  KernelSpec moved = spec;
  moved.inputs.resize(1);
  return MovableDType(moved, "gather");
}

class GatherKernel final : public CudaKernel {
 public:
  GatherKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, int64_t outer,
               int64_t nidx, int64_t axis_size, int64_t inner, std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        fn_(std::move(fn)),
        outer_(outer),
        nidx_(nidx),
        axis_size_(axis_size),
        inner_(inner) {}

  bool capturable() const override { return false; }  // an error slot per launch

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    const std::string label = spec_.label;
    const int64_t n = axis_size_;
    KILN_ASSIGN_OR_RETURN(CUdeviceptr err, s.ReserveErrorSlot([label, n](uint64_t pos, uint64_t v) {
      return absl::OutOfRangeError(absl::StrCat(label, ": gather index ", static_cast<int64_t>(v),
                                                " (at position ", pos, ") is out of range [", -n,
                                                ", ", n, ")"));
    }));
    CUdeviceptr data = in[0], idx = in[1], o = out[0];
    int64_t outer = outer_, nidx = nidx_, axis_size = axis_size_, inner = inner_;
    void* args[] = {&data, &idx, &o, &outer, &nidx, &axis_size, &inner, &err};
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), outer * nidx * inner, 256), 1, 1, 256, 0,
                        args);
  }

 private:
  LoadedFunction fn_;
  int64_t outer_, nidx_, axis_size_, inner_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateGather(CudaDevice& d, const KernelSpec& spec,
                                                              backend::PrepareContext& context) {
  const Dims& data = spec.inputs[0].dims;
  int64_t axis = spec.attrs.gather().axis();
  if (axis < 0) axis += static_cast<int64_t>(data.size());
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= data[k];
  for (size_t k = axis + 1; k < data.size(); ++k) inner *= data[k];
  const DType dt = spec.outputs[0].dtype, it = spec.inputs[1].dtype;
  KILN_ASSIGN_OR_RETURN(
      LoadedFunction fn,
      LoadFunction(d, "gather", KernelSource("gather.cu"),
                   absl::StrCat("kiln_gather_e", ElementSize(dt), "_", DTypeName(it)), context));
  return std::unique_ptr<backend::Kernel>(std::make_unique<GatherKernel>(
      d, spec, std::move(fn), outer, spec.inputs[1].num_elements(), data[axis], inner,
      absl::StrCat("nvrtc:gather_", DTypeSuffix(dt), "_", DTypeSuffix(it))));
}

// ---- Pad ----

// pad.cu's PadParams (passed by value).
struct PadParams {
  int64_t rank = 0, count = 0, mode = 0;
  int64_t out_dims[kMaxRank] = {}, in_dims[kMaxRank] = {}, lo[kMaxRank] = {};
  int64_t in_str[kMaxRank] = {};
};

absl::StatusOr<PadParams> PlanPad(const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("malformed spec");
  }
  const auto& a = spec.attrs.pad();
  const Dims& in = spec.inputs[0].dims;
  const int64_t rank = static_cast<int64_t>(in.size());
  if (a.low_size() != rank || a.high_size() != rank) {
    return absl::InvalidArgumentError("low/high need one entry per dim");
  }
  if (rank > kMaxRank) return absl::InvalidArgumentError(absl::StrCat("rank above ", kMaxRank));
  if (a.mode() != v1::PAD_CONSTANT && a.mode() != v1::PAD_REFLECT && a.mode() != v1::PAD_EDGE) {
    return absl::InvalidArgumentError("unknown pad mode");
  }
  PadParams p;
  p.rank = rank;
  p.mode = a.mode() == v1::PAD_REFLECT ? 1 : a.mode() == v1::PAD_EDGE ? 2 : 0;
  const std::vector<int64_t> strides = RowMajorStrides(in);
  p.count = 1;
  for (int64_t k = 0; k < rank; ++k) {
    const int64_t lo = a.low(k), hi = a.high(k);
    if (lo < 0 || hi < 0)
      return absl::InvalidArgumentError(absl::StrCat("negative pad on dim ", k));
    if (a.mode() == v1::PAD_REFLECT && lo + hi > 0 && (lo >= in[k] || hi >= in[k])) {
      return absl::InvalidArgumentError(
          absl::StrCat("reflect padding on dim ", k, " must be below its size ", in[k]));
    }
    if (a.mode() == v1::PAD_EDGE && in[k] == 0 && lo + hi > 0) {
      return absl::InvalidArgumentError(absl::StrCat("edge padding of the empty dim ", k));
    }
    p.in_dims[k] = in[k];
    p.lo[k] = lo;
    p.in_str[k] = strides[k];
    p.out_dims[k] = in[k] + lo + hi;
    if (spec.outputs[0].dims.size() != in.size() || spec.outputs[0].dims[k] != p.out_dims[k]) {
      return absl::InvalidArgumentError("the result shape is not the padded input's");
    }
    p.count *= p.out_dims[k];
  }
  return p;
}

// The pad value as one element of `dt`, converted as Cast converts
// (integers saturate, NaN becomes 0; f16/bf16 round to nearest even).
uint64_t PadValueBits(double v, DType dt) {
  auto saturate = [v](int64_t lo, int64_t hi) -> int64_t {
    if (std::isnan(v)) return 0;
    if (v <= static_cast<double>(lo)) return lo;
    if (v >= static_cast<double>(hi)) return hi;
    return static_cast<int64_t>(std::trunc(v));
  };
  uint64_t bits = 0;
  switch (dt) {
    case v1::DTYPE_F32: {
      const float f = static_cast<float>(v);
      std::memcpy(&bits, &f, 4);
      break;
    }
    case v1::DTYPE_F64:
      std::memcpy(&bits, &v, 8);
      break;
    case v1::DTYPE_F16:
      bits = FloatToHalf(static_cast<float>(v));
      break;
    case v1::DTYPE_BF16:
      bits = FloatToBf16(static_cast<float>(v));
      break;
    case v1::DTYPE_BOOL:
      bits = v != 0.0 ? 1 : 0;
      break;
    case v1::DTYPE_I8:
      bits = static_cast<uint8_t>(saturate(-128, 127));
      break;
    case v1::DTYPE_U8:
      bits = static_cast<uint8_t>(saturate(0, 255));
      break;
    case v1::DTYPE_I16:
      bits = static_cast<uint16_t>(saturate(-32768, 32767));
      break;
    case v1::DTYPE_I32:
      bits = static_cast<uint32_t>(
          saturate(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
      break;
    default:
      bits = static_cast<uint64_t>(
          saturate(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
      break;
  }
  return bits;
}

Claim SupportsPad(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<PadParams> p = PlanPad(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda pad: ", p.status().message()));
  return MovableDType(spec, "pad");
}

class PadKernel final : public CudaKernel {
 public:
  PadKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, PadParams params,
            uint64_t value)
      : CudaKernel(d, spec, absl::StrCat("nvrtc:pad_", DTypeSuffix(spec.outputs[0].dtype))),
        fn_(std::move(fn)),
        params_(params),
        value_(value) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], y = out[0];
    PadParams p = params_;
    // The value argument has the element's size: its low bytes (little endian).
    uint64_t value = value_;
    void* args[] = {&x, &y, &p, &value};
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), p.count, 256), 1, 1, 256, 0, args);
  }

 private:
  LoadedFunction fn_;
  PadParams params_;
  uint64_t value_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreatePad(CudaDevice& d, const KernelSpec& spec,
                                                           backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(PadParams p, PlanPad(spec));
  const DType dt = spec.outputs[0].dtype;
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                        LoadFunction(d, "pad", KernelSource("pad.cu"),
                                     absl::StrCat("kiln_pad_e", ElementSize(dt)), context));
  return std::unique_ptr<backend::Kernel>(std::make_unique<PadKernel>(
      d, spec, std::move(fn), p, PadValueBits(spec.attrs.pad().value(), dt)));
}

const CudaOpRegistration kDataRegistration({
    {v1::OP_PAD, &SupportsPad, &CreatePad},
    {v1::OP_GATHER, &SupportsGather, &CreateGather},
    {v1::OP_TRANSPOSE, &SupportsStrided, &CreateStrided},
    {v1::OP_SLICE, &SupportsStrided, &CreateStrided},
    {v1::OP_EXPAND, &SupportsStrided, &CreateStrided},
    {v1::OP_CONCAT, &SupportsStrided, &CreateStrided},
    {v1::OP_RESHAPE, &SupportsByteCopy, &CreateByteCopy},
    {v1::OP_COPY, &SupportsByteCopy, &CreateByteCopy},
});

}  // namespace
}  // namespace kiln::cuda
