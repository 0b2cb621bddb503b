// Data movement: Transpose, Slice, Expand, Concat (strided_copy.comp),
// Reshape and Copy (transfer copies), Gather (gather.comp). These move bytes
// without looking at them, so they serve every dense dtype the device can
// store, f64 and i64 included.
#include <algorithm>
#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_kernel.h"
#include "backends/vulkan/vk_util.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

using backend::Claim;
using backend::KernelSpec;

constexpr int kMaxRank = 8;

// The strided_copy push constants (see the shader).
struct StridedPush {
  uint32_t count = 1;
  uint32_t rank = 0;
  uint32_t src_base = 0;
  uint32_t dst_base = 0;
  uint32_t dims[kMaxRank] = {};
  uint32_t src_strides[kMaxRank] = {};
  uint32_t dst_strides[kMaxRank] = {};
};
static_assert(sizeof(StridedPush) == 112);

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

absl::StatusOr<StridedPush> ToPush(const StridedCopy& raw) {
  const StridedCopy c = Simplify(raw);
  if (c.dims.size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", c.dims.size(), " after merging dims"));
  }
  StridedPush p;
  p.rank = static_cast<uint32_t>(c.dims.size());
  p.src_base = static_cast<uint32_t>(c.src_base);
  p.dst_base = static_cast<uint32_t>(c.dst_base);
  int64_t count = 1;
  for (size_t k = 0; k < c.dims.size(); ++k) {
    p.dims[k] = static_cast<uint32_t>(c.dims[k]);
    p.src_strides[k] = static_cast<uint32_t>(c.src[k]);
    p.dst_strides[k] = static_cast<uint32_t>(c.dst[k]);
    count *= c.dims[k];
  }
  p.count = static_cast<uint32_t>(count);
  return p;
}

std::string ElemVariant(const char* shader, DType dtype) {
  return absl::StrCat(shader, "_e", ElementSize(dtype));
}

Claim StoredDType(const VulkanDevice& d, DType dtype, const char* op) {
  if (IsQuantized(dtype) || ElementSize(dtype) == 0) {
    return Claim::No(
        absl::StrCat("vulkan ", op, " moves dense types only, not ", DTypeName(dtype)));
  }
  if (!StorageOk(d.caps(), dtype)) {
    return Claim::No(absl::StrCat("vulkan ", op, ": ", StorageMissing(d.caps(), dtype)));
  }
  return Claim::Yes();
}

// The copies a spec performs: one per input (concat) or one (the rest).
absl::StatusOr<std::vector<StridedCopy>> PlanCopies(const KernelSpec& spec) {
  const backend::TensorDesc& out = spec.outputs[0];
  const std::vector<int64_t> out_strides = RowMajorStrides(out.dims);
  std::vector<StridedCopy> copies;
  switch (spec.op) {
    case v1::OP_TRANSPOSE: {
      const auto& perm = spec.attrs.transpose().perm();
      const std::vector<int64_t> in_strides = RowMajorStrides(spec.inputs[0].dims);
      if (perm.size() != static_cast<int>(spec.inputs[0].dims.size())) {
        return absl::InvalidArgumentError("perm does not match the input rank");
      }
      StridedCopy c;
      c.dims = out.dims;
      c.dst = out_strides;
      for (int64_t p : perm) c.src.push_back(in_strides[p]);
      copies.push_back(std::move(c));
      break;
    }
    case v1::OP_SLICE: {
      const auto& a = spec.attrs.slice();
      const Dims& in = spec.inputs[0].dims;
      const std::vector<int64_t> in_strides = RowMajorStrides(in);
      StridedCopy c;
      c.dims = out.dims;
      c.dst = out_strides;
      c.src = in_strides;
      const int n = a.axes().empty() ? static_cast<int>(in.size()) : a.axes_size();
      for (int i = 0; i < n; ++i) {
        int64_t axis = a.axes().empty() ? i : a.axes(i);
        if (axis < 0) axis += static_cast<int64_t>(in.size());
        const int64_t dim = in[axis];
        int64_t start = a.start(i);
        if (start < 0) start += dim;
        start = std::clamp<int64_t>(start, 0, dim);
        const int64_t step = a.step().empty() ? 1 : a.step(i);
        if (out.dims[axis] > 0) c.src_base += start * in_strides[axis];
        c.src[axis] = in_strides[axis] * step;
      }
      copies.push_back(std::move(c));
      break;
    }
    case v1::OP_EXPAND: {
      const Dims& in = spec.inputs[0].dims;
      const std::vector<int64_t> in_strides = RowMajorStrides(in);
      const size_t off = out.dims.size() - in.size();
      StridedCopy c;
      c.dims = out.dims;
      c.dst = out_strides;
      c.src.assign(out.dims.size(), 0);
      for (size_t k = 0; k < in.size(); ++k) {
        c.src[off + k] = in[k] == 1 ? 0 : in_strides[k];
      }
      copies.push_back(std::move(c));
      break;
    }
    case v1::OP_CONCAT: {
      int64_t axis = spec.attrs.concat().axis();
      if (axis < 0) axis += static_cast<int64_t>(out.dims.size());
      int64_t at = 0;
      for (const backend::TensorDesc& in : spec.inputs) {
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

Claim SupportsStrided(const VulkanDevice& d, const KernelSpec& spec) {
  if (spec.outputs.size() != 1 || spec.inputs.empty()) return Claim::No("malformed spec");
  const char* op = spec.op == v1::OP_TRANSPOSE ? "transpose"
                   : spec.op == v1::OP_SLICE   ? "slice"
                   : spec.op == v1::OP_EXPAND  ? "expand"
                                               : "concat";
  if (Claim c = StoredDType(d, spec.outputs[0].dtype, op); !c.native) return c;
  absl::StatusOr<std::vector<StridedCopy>> copies = PlanCopies(spec);
  if (!copies.ok()) return Claim::No(absl::StrCat("vulkan ", op, ": ", copies.status().message()));
  for (const StridedCopy& c : *copies) {
    if (!ToPush(c).ok()) {
      return Claim::No(absl::StrCat("vulkan ", op, " handles up to ", kMaxRank,
                                    " dims after merging contiguous ones"));
    }
  }
  return Claim::Yes();
}

class StridedCopyKernel final : public VulkanKernel {
 public:
  StridedCopyKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
                    std::vector<StridedPush> pushes, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)),
        pipeline_(std::move(p)),
        pushes_(std::move(pushes)) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    const uint32_t wg = Workgroup1D(device_.caps());
    for (size_t i = 0; i < pushes_.size(); ++i) {
      const StridedPush& p = pushes_[i];
      if (p.count == 0 || spec_.inputs[i].num_elements() == 0) continue;
      const BufferBinding b[2] = {in[i], out[0]};
      KILN_RETURN_IF_ERROR(
          s.Dispatch(*pipeline_, b, 0b10, &p, sizeof(p), Groups1D(device_.caps(), p.count, wg)));
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  std::vector<StridedPush> pushes_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateStrided(VulkanDevice& d,
                                                               const KernelSpec& spec,
                                                               backend::PrepareContext&) {
  KILN_ASSIGN_OR_RETURN(std::vector<StridedCopy> copies, PlanCopies(spec));
  std::vector<StridedPush> pushes;
  for (const StridedCopy& c : copies) {
    KILN_ASSIGN_OR_RETURN(StridedPush p, ToPush(c));
    pushes.push_back(p);
  }
  const DType dt = spec.outputs[0].dtype;
  const std::string variant = ElemVariant("strided_copy", dt);
  KILN_ASSIGN_OR_RETURN(
      auto pipeline, EmbeddedPipeline(d, variant, 2, sizeof(StridedPush), {Workgroup1D(d.caps())}));
  const std::string op = absl::AsciiStrToLower(v1::OpKind_Name(spec.op).substr(3));
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<StridedCopyKernel>(d, spec, std::move(pipeline), std::move(pushes),
                                          absl::StrCat("spirv:", op, "_", DTypeSuffix(dt))));
}

// Reshape and Copy: the bytes are already in order; one transfer copy.
class ByteCopyKernel final : public VulkanKernel {
 public:
  using VulkanKernel::VulkanKernel;

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    return s.Copy(in[0], out[0], static_cast<uint64_t>(spec_.outputs[0].num_bytes()));
  }
};

Claim SupportsByteCopy(const VulkanDevice& d, const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) return Claim::No("malformed spec");
  if (spec.inputs[0].num_bytes() != spec.outputs[0].num_bytes()) {
    return Claim::No("vulkan copy: input and output sizes differ");
  }
  return StoredDType(d, spec.outputs[0].dtype, "copy");
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateByteCopy(VulkanDevice& d,
                                                                const KernelSpec& spec,
                                                                backend::PrepareContext&) {
  const char* what = spec.op == v1::OP_RESHAPE ? "reshape" : "copy";
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<ByteCopyKernel>(d, spec, absl::StrCat("vulkan:transfer_", what)));
}

// ---- Gather ----

struct GatherPush {
  uint32_t outer, nidx, axis_size, inner, slot;
};

class GatherKernel final : public VulkanKernel {
 public:
  GatherKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
               GatherPush push, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)), pipeline_(std::move(p)), push_(push) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    const std::string label = spec_.label;
    const int64_t n = push_.axis_size;
    KILN_ASSIGN_OR_RETURN(
        VulkanStream::ErrorSlot slot,
        s.ReserveErrorSlot([label, n](uint32_t, const std::array<uint32_t, 3>& d) {
          const int64_t index = static_cast<int64_t>((uint64_t{d[2]} << 32) | d[1]);
          return absl::OutOfRangeError(absl::StrCat(label, ": gather index ", index,
                                                    " (at position ", d[0], ") is out of range [",
                                                    -n, ", ", n, ")"));
        }));
    GatherPush p = push_;
    p.slot = slot.index;
    BufferBinding indices = in[1];
    indices.range = AlignUp(indices.range, 4);  // narrow indices are read as words
    const BufferBinding b[4] = {in[0], indices, out[0], slot.buffer};
    const uint64_t total = uint64_t{p.outer} * p.nidx * p.inner;
    const uint32_t wg = Workgroup1D(device_.caps());
    return s.Dispatch(*pipeline_, b, 0b1100, &p, sizeof(p), Groups1D(device_.caps(), total, wg));
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  GatherPush push_;
};

// The gather shader's IDX_KIND for an index dtype, or -1.
int IndexKind(DType d) {
  switch (d) {
    case v1::DTYPE_I32:
      return 0;
    case v1::DTYPE_I64:
      return 1;
    case v1::DTYPE_I16:
      return 2;
    case v1::DTYPE_I8:
      return 3;
    case v1::DTYPE_U8:
      return 4;
    default:
      return -1;
  }
}

Claim SupportsGather(const VulkanDevice& d, const KernelSpec& spec) {
  if (spec.inputs.size() != 2 || spec.outputs.size() != 1) return Claim::No("malformed spec");
  if (IndexKind(spec.inputs[1].dtype) < 0) {
    return Claim::No(absl::StrCat("vulkan gather reads signed or u8 integer indices, not ",
                                  DTypeName(spec.inputs[1].dtype)));
  }
  return StoredDType(d, spec.outputs[0].dtype, "gather");
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateGather(VulkanDevice& d,
                                                              const KernelSpec& spec,
                                                              backend::PrepareContext&) {
  const Dims& data = spec.inputs[0].dims;
  int64_t axis = spec.attrs.gather().axis();
  if (axis < 0) axis += static_cast<int64_t>(data.size());
  GatherPush p{1, static_cast<uint32_t>(spec.inputs[1].num_elements()),
               static_cast<uint32_t>(data[axis]), 1, 0};
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= data[k];
  for (size_t k = axis + 1; k < data.size(); ++k) inner *= data[k];
  p.outer = static_cast<uint32_t>(outer);
  p.inner = static_cast<uint32_t>(inner);
  const DType dt = spec.outputs[0].dtype;
  const DType it = spec.inputs[1].dtype;
  KILN_ASSIGN_OR_RETURN(
      auto pipeline,
      EmbeddedPipeline(d, ElemVariant("gather", dt), 4, sizeof(GatherPush),
                       {Workgroup1D(d.caps()), static_cast<uint32_t>(IndexKind(it))}));
  return std::unique_ptr<backend::Kernel>(std::make_unique<GatherKernel>(
      d, spec, std::move(pipeline), p,
      absl::StrCat("spirv:gather_", DTypeSuffix(dt), "_", DTypeSuffix(it))));
}

const VulkanOpRegistration kDataRegistration({
    {v1::OP_TRANSPOSE, &SupportsStrided, &CreateStrided},
    {v1::OP_SLICE, &SupportsStrided, &CreateStrided},
    {v1::OP_EXPAND, &SupportsStrided, &CreateStrided},
    {v1::OP_CONCAT, &SupportsStrided, &CreateStrided},
    {v1::OP_RESHAPE, &SupportsByteCopy, &CreateByteCopy},
    {v1::OP_COPY, &SupportsByteCopy, &CreateByteCopy},
    {v1::OP_GATHER, &SupportsGather, &CreateGather},
});

}  // namespace
}  // namespace kiln::vulkan
