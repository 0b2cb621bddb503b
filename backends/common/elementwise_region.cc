#include "backends/common/elementwise_region.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace kiln::backend {
namespace {

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(what); }

bool IsDense(DType d) { return IsKnownDType(d) && !IsQuantized(d); }

std::string Lower(const std::string& enum_name, size_t prefix) {
  return absl::AsciiStrToLower(enum_name.substr(std::min(prefix, enum_name.size())));
}

int Arity(v1::OpKind op) {
  switch (op) {
    case v1::OP_CONSTANT:
      return 0;
    case v1::OP_BINARY:
    case v1::OP_COMPARE:
      return 2;
    case v1::OP_WHERE:
      return 3;
    default:
      return 1;
  }
}

// Decodes instruction `index` against the dtypes of the values before it
// (`values`: the region's inputs, then earlier instructions).
absl::StatusOr<RegionInstr> DecodeInstr(const v1::FusedInstr& f, int index,
                                        const std::vector<DType>& values) {
  RegionInstr in;
  in.op = f.op();
  in.dtype = f.dtype();
  const std::string where = absl::StrCat("instruction ", index, " (", v1::OpKind_Name(f.op()), ")");
  switch (f.op()) {
    case v1::OP_UNARY:
    case v1::OP_BINARY:
    case v1::OP_COMPARE:
    case v1::OP_WHERE:
    case v1::OP_CAST:
    case v1::OP_CLAMP:
    case v1::OP_CONSTANT:
      break;
    default:
      return Bad(absl::StrCat(where, " is not an elementwise instruction (a region holds unary, ",
                              "binary, compare, where, cast, clamp and scalar constants)"));
  }
  const int arity = Arity(f.op());
  if (f.args_size() != arity) {
    return Bad(absl::StrCat(where, " takes ", arity, " operands, got ", f.args_size()));
  }
  in.num_args = arity;
  for (int k = 0; k < arity; ++k) {
    const int a = f.args(k);
    if (a < 0 || a >= static_cast<int>(values.size())) {
      return Bad(absl::StrCat(where, " reads value ", a, ", which is not defined before it"));
    }
    in.args[k] = a;
  }
  auto arg = [&](int k) { return values[in.args[k]]; };
  auto same = [&](int a, int b) -> absl::Status {
    if (arg(a) == arg(b)) return absl::OkStatus();
    return Bad(absl::StrCat(where, " mixes ", DTypeName(arg(a)), " and ", DTypeName(arg(b))));
  };
  auto result_is = [&](DType want) -> absl::Status {
    if (in.dtype == want) return absl::OkStatus();
    return Bad(absl::StrCat(where, " declares result ", DTypeName(in.dtype), ", computes ",
                            DTypeName(want)));
  };
  if (arity > 0) in.arg_dtype = arg(0);
  switch (f.op()) {
    case v1::OP_UNARY:
      in.kind = f.unary().kind();
      if (in.kind == v1::UNARY_KIND_UNSPECIFIED || !v1::UnaryKind_IsValid(in.kind)) {
        return Bad(absl::StrCat(where, " has unknown unary kind ", in.kind));
      }
      KILN_RETURN_IF_ERROR(result_is(arg(0)));
      break;
    case v1::OP_BINARY:
      KILN_RETURN_IF_ERROR(same(0, 1));
      in.kind = f.binary().kind();
      if (in.kind == v1::BINARY_KIND_UNSPECIFIED || !v1::BinaryKind_IsValid(in.kind)) {
        return Bad(absl::StrCat(where, " has unknown binary kind ", in.kind));
      }
      KILN_RETURN_IF_ERROR(result_is(arg(0)));
      break;
    case v1::OP_COMPARE:
      KILN_RETURN_IF_ERROR(same(0, 1));
      in.kind = f.compare().kind();
      if (in.kind == v1::COMPARE_KIND_UNSPECIFIED || !v1::CompareKind_IsValid(in.kind)) {
        return Bad(absl::StrCat(where, " has unknown compare kind ", in.kind));
      }
      KILN_RETURN_IF_ERROR(result_is(v1::DTYPE_BOOL));
      break;
    case v1::OP_WHERE:
      if (arg(0) != v1::DTYPE_BOOL) {
        return Bad(absl::StrCat(where, " needs a bool condition, got ", DTypeName(arg(0))));
      }
      KILN_RETURN_IF_ERROR(same(1, 2));
      KILN_RETURN_IF_ERROR(result_is(arg(1)));
      break;
    case v1::OP_CAST: {
      const DType to = f.cast().to() == v1::DTYPE_UNSPECIFIED ? in.dtype : f.cast().to();
      if (!IsDense(to)) {
        return Bad(absl::StrCat(where, " casts to ", DTypeName(to), ", not a dense type"));
      }
      KILN_RETURN_IF_ERROR(result_is(to));
      break;
    }
    case v1::OP_CLAMP: {
      const v1::ClampAttrs& c = f.clamp();
      in.has_lo = c.has_min();
      in.has_hi = c.has_max();
      in.lo = c.min();
      in.hi = c.max();
      if ((in.has_lo && std::isnan(in.lo)) || (in.has_hi && std::isnan(in.hi)) ||
          (in.has_lo && in.has_hi && in.lo > in.hi)) {
        return Bad(absl::StrCat(where, " has bounds [", in.has_lo ? absl::StrCat(in.lo) : "-inf",
                                ", ", in.has_hi ? absl::StrCat(in.hi) : "inf", "]"));
      }
      KILN_RETURN_IF_ERROR(result_is(arg(0)));
      break;
    }
    case v1::OP_CONSTANT:
      if (!IsDense(in.dtype)) {
        return Bad(absl::StrCat(where, " has dtype ", DTypeName(in.dtype), ", not a dense type"));
      }
      in.scalar = f.scalar();
      break;
    default:
      break;
  }
  return in;
}

}  // namespace

bool ElementwiseRegion::is_result(int j) const {
  return std::find(results.begin(), results.end(), j) != results.end();
}

absl::StatusOr<ElementwiseRegion> DecodeRegion(const v1::FusedElementwiseAttrs& region,
                                               std::span<const DType> inputs,
                                               std::span<const DType> outputs) {
  ElementwiseRegion r;
  if (inputs.empty()) return Bad("a fused region needs at least one input");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!IsDense(inputs[i])) {
      return Bad(absl::StrCat("input ", i, " is ", DTypeName(inputs[i]),
                              "; elementwise ops read dense types (block-quantized types are "
                              "read only by dequantize)"));
    }
  }
  if (region.results_size() == 0) return Bad("a fused region needs at least one result");
  if (static_cast<size_t>(region.results_size()) != outputs.size()) {
    return Bad(absl::StrCat("region has ", region.results_size(), " results but ", outputs.size(),
                            " outputs are declared"));
  }
  r.inputs.assign(inputs.begin(), inputs.end());
  std::vector<DType> values = r.inputs;
  r.instrs.reserve(region.instrs_size());
  for (int j = 0; j < region.instrs_size(); ++j) {
    KILN_ASSIGN_OR_RETURN(RegionInstr in, DecodeInstr(region.instrs(j), j, values));
    values.push_back(in.dtype);
    r.instrs.push_back(in);
  }
  for (int k = 0; k < region.results_size(); ++k) {
    const int res = region.results(k);
    if (res < 0 || res >= static_cast<int>(r.instrs.size())) {
      return Bad(
          absl::StrCat("region result ", k, " reads instruction ", res, ", which does not exist"));
    }
    if (r.instrs[res].dtype != outputs[k]) {
      return Bad(absl::StrCat("output ", k, " is ", DTypeName(outputs[k]), " but instruction ", res,
                              " computes ", DTypeName(r.instrs[res].dtype)));
    }
    r.results.push_back(res);
  }
  return r;
}

bool IsStandaloneElementwise(v1::OpKind op) {
  switch (op) {
    case v1::OP_UNARY:
    case v1::OP_BINARY:
    case v1::OP_COMPARE:
    case v1::OP_WHERE:
    case v1::OP_CAST:
    case v1::OP_CLAMP:
      return true;
    default:
      return false;
  }
}

int StandaloneArity(v1::OpKind op) { return Arity(op); }

v1::FusedInstr InstrFor(v1::OpKind op, const v1::Attrs& attrs, std::span<const int> args,
                        DType dtype) {
  v1::FusedInstr f;
  f.set_op(op);
  for (int a : args) f.add_args(a);
  f.set_dtype(dtype);
  switch (op) {
    case v1::OP_UNARY:
      *f.mutable_unary() = attrs.unary();
      break;
    case v1::OP_BINARY:
      *f.mutable_binary() = attrs.binary();
      break;
    case v1::OP_COMPARE:
      *f.mutable_compare() = attrs.compare();
      break;
    case v1::OP_CAST:
      *f.mutable_cast() = attrs.cast();
      break;
    case v1::OP_CLAMP:
      *f.mutable_clamp() = attrs.clamp();
      break;
    default:
      break;
  }
  return f;
}

absl::StatusOr<ElementwiseRegion> DecodeSpec(const KernelSpec& spec) {
  std::vector<DType> inputs, outputs;
  for (const TensorDesc& d : spec.inputs) inputs.push_back(d.dtype);
  for (const TensorDesc& d : spec.outputs) outputs.push_back(d.dtype);
  if (spec.op == v1::OP_FUSED_ELEMENTWISE) {
    return DecodeRegion(spec.attrs.fused_elementwise(), inputs, outputs);
  }
  if (!IsStandaloneElementwise(spec.op)) {
    return Bad(absl::StrCat(v1::OpKind_Name(spec.op), " is not an elementwise op"));
  }
  const int arity = Arity(spec.op);
  if (inputs.size() != static_cast<size_t>(arity) || outputs.size() != 1) {
    return Bad(absl::StrCat("expects ", arity, " inputs and 1 output, got ", inputs.size(), " and ",
                            outputs.size()));
  }
  std::vector<int> args(arity);
  std::iota(args.begin(), args.end(), 0);
  v1::FusedElementwiseAttrs region;
  *region.add_instrs() = InstrFor(spec.op, spec.attrs, args, outputs[0]);
  region.add_results(0);
  return DecodeRegion(region, inputs, outputs);
}

std::string InstrName(const RegionInstr& in) {
  switch (in.op) {
    case v1::OP_UNARY:
      return Lower(v1::UnaryKind_Name(static_cast<v1::UnaryKind>(in.kind)), 6);
    case v1::OP_BINARY:
      return Lower(v1::BinaryKind_Name(static_cast<v1::BinaryKind>(in.kind)), 7);
    case v1::OP_COMPARE:
      return Lower(v1::CompareKind_Name(static_cast<v1::CompareKind>(in.kind)), 8);
    case v1::OP_WHERE:
      return "where";
    case v1::OP_CAST:
      return absl::StrCat("cast_", DTypeName(in.arg_dtype), "_to");
    case v1::OP_CLAMP:
      return "clamp";
    case v1::OP_CONSTANT:
      return "constant";
    default:
      return "?";
  }
}

std::vector<DType> RegionValueDTypes(const ElementwiseRegion& r) {
  std::vector<DType> d(r.inputs);
  for (const RegionInstr& in : r.instrs) d.push_back(in.dtype);
  return d;
}

RegionIndexPlan PlanRegionIndexing(const KernelSpec& spec) {
  const Dims& out = spec.outputs[0].dims;
  const size_t rank = out.size();
  std::vector<std::vector<int64_t>> full(spec.inputs.size(), std::vector<int64_t>(rank, 0));
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const Dims& in = spec.inputs[i].dims;
    int64_t stride = 1;
    const size_t off = rank - in.size();
    for (size_t k = in.size(); k-- > 0;) {  // row-major strides; a size-1 dim broadcasts
      full[i][off + k] = in[k] == 1 ? 0 : stride;
      stride *= in[k];
    }
  }
  RegionIndexPlan p;
  p.strides.resize(spec.inputs.size());
  for (size_t k = 0; k < rank; ++k) {
    if (out[k] == 1) continue;
    bool merge = !p.dims.empty();
    for (size_t i = 0; merge && i < full.size(); ++i) {
      merge = p.strides[i].back() == full[i][k] * out[k];
    }
    if (merge) {
      p.dims.back() *= out[k];
      for (size_t i = 0; i < full.size(); ++i) p.strides[i].back() = full[i][k];
      continue;
    }
    p.dims.push_back(out[k]);
    for (size_t i = 0; i < full.size(); ++i) p.strides[i].push_back(full[i][k]);
  }
  return p;
}

std::string RegionIndexExpr(const RegionIndexPlan& plan, int input, int kind, const char* suffix) {
  if (kind == 0) return "i";
  std::vector<std::string> terms;
  for (size_t k = 0; kind == 2 && k < plan.dims.size(); ++k) {
    const int64_t s = plan.strides[input][k];
    if (s == 0) continue;
    terms.push_back(s == 1 ? absl::StrCat("c", k) : absl::StrCat("c", k, " * ", s, suffix));
  }
  return terms.empty() ? absl::StrCat("0", suffix) : absl::StrJoin(terms, " + ");
}

}  // namespace kiln::backend
