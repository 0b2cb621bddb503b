// Import-time folding: Constant nodes, Shape/Size of known shapes, and the small
// integer arithmetic and data movement of shape subgraphs (Shape -> Gather ->
// Concat -> Reshape), so that a reshape target or a pad list is known when the
// op that needs it is converted. Elements that are run-time dims (a symbolic
// batch) travel as `Known::sym` entries through data movement; arithmetic on
// them gives an unknown element.
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_join.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

namespace kiln::io::onnx_internal {
namespace {

using Index = std::vector<int64_t>;

constexpr int64_t kMaxFolded = int64_t{1} << 20;

Dims Strides(const Dims& dims) {
  Dims s(dims.size(), 1);
  for (int64_t i = static_cast<int64_t>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

int64_t Count(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

// A folded result: elements copied (by index) from sources, or computed.
struct Builder {
  HostTensor t;
  std::vector<int64_t> sym;
  bool any_sym = false;

  // A result too large to fold is OUT_OF_RANGE, which TryFold reads as "do
  // not fold" (the node is converted to graph ops instead).
  static absl::StatusOr<Builder> Make(DType dt, Dims dims) {
    auto n = CheckedNumElements(dims);
    if (!n.ok() || *n > kMaxFolded) return absl::OutOfRangeError("too large to fold");
    Builder b;
    KILN_ASSIGN_OR_RETURN(b.t, HostTensor::Create(dt, std::move(dims)));
    b.sym.assign(b.t.num_elements(), 0);
    return b;
  }
  void Copy(int64_t j, const Known& src, int64_t i) {
    const int64_t es = ElementSize(t.dtype());
    std::memcpy(static_cast<char*>(t.data()) + j * es,
                static_cast<const char*>(src.t->data()) + i * es, es);
    if (!src.complete() && src.sym[i] != 0) {
      sym[j] = src.sym[i];
      any_sym = true;
    }
  }
  void MarkUnknown(int64_t j) {
    sym[j] = ir::kDynamic;
    any_sym = true;
  }
  std::shared_ptr<const Known> Done() {
    auto k = std::make_shared<Known>();
    k->t = std::make_shared<const HostTensor>(std::move(t));
    if (any_sym) k->sym = std::move(sym);
    return k;
  }
};

bool SymAt(const Known& k, int64_t i) { return !k.complete() && k.sym[i] != 0; }

// Broadcast output dims, or false.
bool Broadcast(const std::vector<const Dims*>& ins, Dims* out) {
  size_t rank = 0;
  for (const Dims* d : ins) rank = std::max(rank, d->size());
  out->assign(rank, 1);
  for (const Dims* d : ins) {
    const size_t off = rank - d->size();
    for (size_t i = 0; i < d->size(); ++i) {
      const int64_t v = (*d)[i];
      int64_t& o = (*out)[off + i];
      if (v == o || v == 1) continue;
      if (o != 1) return false;
      o = v;
    }
  }
  return true;
}

int64_t BroadcastSource(int64_t j, const Dims& out, const Dims& in) {
  int64_t src = 0, stride = 1, rem = j;
  const Dims os = Strides(out);
  (void)rem;
  const size_t off = out.size() - in.size();
  Dims is = Strides(in);
  for (size_t k = 0; k < out.size(); ++k) {
    const int64_t coord = (j / os[k]) % out[k];
    if (k >= off && in[k - off] != 1) src += coord * is[k - off];
  }
  (void)stride;
  return src;
}

bool AllKnown(Importer& c) {
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (c.has(i) && !c.in(i).known) return false;
  }
  return true;
}

const Known& K(Importer& c, int i) { return *c.in(i).known; }

absl::StatusOr<bool> FoldConstant(Importer& c) {
  if (const auto* a = c.Attr("value")) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, TensorFromProto(a->t(), c.options().limits));
    KILN_RETURN_IF_ERROR(c.SetConst(0, std::move(t)));
    return true;
  }
  if (const auto* a = c.Attr("value_float")) {
    KILN_RETURN_IF_ERROR(c.SetConst(0, HostTensor::FromVector<float>(v1::DTYPE_F32, {}, {a->f()})));
    return true;
  }
  if (const auto* a = c.Attr("value_floats")) {
    std::vector<float> v(a->floats().begin(), a->floats().end());
    KILN_RETURN_IF_ERROR(c.SetConst(0, HostTensor::FromVector(v1::DTYPE_F32, {static_cast<int64_t>(v.size())}, v)));
    return true;
  }
  if (const auto* a = c.Attr("value_int")) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(v1::DTYPE_I64, {}));
    SetInt(t, 0, a->i());
    KILN_RETURN_IF_ERROR(c.SetConst(0, std::move(t)));
    return true;
  }
  if (const auto* a = c.Attr("value_ints")) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(v1::DTYPE_I64, {a->ints_size()}));
    for (int i = 0; i < a->ints_size(); ++i) SetInt(t, i, a->ints(i));
    KILN_RETURN_IF_ERROR(c.SetConst(0, std::move(t)));
    return true;
  }
  return c.Unsupported("Constant with a sparse or string value");
}

absl::StatusOr<bool> FoldShape(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(0));
  const IrDims& d = c.type(0).dims;
  const int64_t rank = static_cast<int64_t>(d.size());
  int64_t start = c.AttrInt("start", 0), end = c.AttrInt("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, start, rank);
  KILN_ASSIGN_OR_RETURN(Builder b, Builder::Make(v1::DTYPE_I64, {end - start}));
  for (int64_t i = start; i < end; ++i) {
    if (d[i] >= 0) {
      SetInt(b.t, i - start, d[i]);
    } else {
      b.sym[i - start] = d[i];
      b.any_sym = true;
    }
  }
  c.SetKnown(0, b.Done());
  return true;
}

absl::StatusOr<bool> FoldSize(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(0));
  if (!c.type(0).is_static()) {
    return c.Unsupported("Size of a tensor with run-time dims (pin the input shapes)");
  }
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(v1::DTYPE_I64, {}));
  SetInt(t, 0, c.type(0).num_elements());
  KILN_RETURN_IF_ERROR(c.SetConst(0, std::move(t)));
  return true;
}

// A copy of input 0 under new dims (reshape, squeeze, unsqueeze, flatten, identity).
absl::StatusOr<bool> Relabel(Importer& c, Dims dims) {
  const Known& x = K(c, 0);
  KILN_ASSIGN_OR_RETURN(Builder b, Builder::Make(x.t->dtype(), std::move(dims)));
  if (b.t.num_elements() != x.t->num_elements()) return false;
  for (int64_t i = 0; i < x.t->num_elements(); ++i) b.Copy(i, x, i);
  c.SetKnown(0, b.Done());
  return true;
}

absl::StatusOr<bool> FoldCast(Importer& c, DType to) {
  const Known& x = K(c, 0);
  KILN_ASSIGN_OR_RETURN(Builder b, Builder::Make(to, x.t->dims()));
  const bool int_out = IsInteger(to) || to == v1::DTYPE_BOOL;
  for (int64_t i = 0; i < x.t->num_elements(); ++i) {
    if (SymAt(x, i)) {
      if (!IsInteger(to)) return false;
      b.sym[i] = x.sym[i];
      b.any_sym = true;
      continue;
    }
    if (int_out && (IsInteger(x.t->dtype()) || x.t->dtype() == v1::DTYPE_BOOL)) {
      SetInt(b.t, i, GetInt(*x.t, i));
    } else if (to == v1::DTYPE_BOOL) {
      SetInt(b.t, i, x.t->GetAsDouble(i) != 0);
    } else if (int_out) {
      const double v = x.t->GetAsDouble(i);
      // Not finite or past int64: the kernel's saturation rules apply (a cast
      // here would be undefined behaviour).
      if (!std::isfinite(v) || v < -0x1p63 || v >= 0x1p63) return false;
      SetInt(b.t, i, static_cast<int64_t>(v));
    } else {
      b.t.SetFromDouble(i, IsInteger(x.t->dtype()) ? static_cast<double>(GetInt(*x.t, i))
                                                   : x.t->GetAsDouble(i));
    }
  }
  c.SetKnown(0, b.Done());
  return true;
}

absl::StatusOr<bool> FoldConcat(Importer& c) {
  const int64_t rank = K(c, 0).t->rank();
  if (rank == 0) return false;
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", 0), rank));
  Dims out = K(c, 0).t->dims();
  out[axis] = 0;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i)) continue;
    const Dims& d = K(c, i).t->dims();
    if (static_cast<int64_t>(d.size()) != rank || K(c, i).t->dtype() != K(c, 0).t->dtype()) return false;
    out[axis] += d[axis];
  }
  KILN_ASSIGN_OR_RETURN(Builder b, Builder::Make(K(c, 0).t->dtype(), out));
  const int64_t outer = Count(Dims(out.begin(), out.begin() + axis));
  const int64_t inner = Count(Dims(out.begin() + axis + 1, out.end()));
  int64_t j = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int i = 0; i < c.num_inputs(); ++i) {
      if (!c.has(i)) continue;
      const Known& x = K(c, i);
      const int64_t chunk = x.t->dims()[axis] * inner;
      for (int64_t e = 0; e < chunk; ++e) b.Copy(j++, x, o * chunk + e);
    }
  }
  c.SetKnown(0, b.Done());
  return true;
}

absl::StatusOr<bool> FoldGather(Importer& c) {
  const Known& x = K(c, 0);
  if (!K(c, 1).complete() || x.t->rank() == 0) return false;
  const HostTensor& idx = *K(c, 1).t;
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", 0), x.t->rank()));
  const Dims& xd = x.t->dims();
  Dims out(xd.begin(), xd.begin() + axis);
  out.insert(out.end(), idx.dims().begin(), idx.dims().end());
  out.insert(out.end(), xd.begin() + axis + 1, xd.end());
  KILN_ASSIGN_OR_RETURN(Builder b, Builder::Make(x.t->dtype(), out));
  const int64_t outer = Count(Dims(xd.begin(), xd.begin() + axis));
  const int64_t inner = Count(Dims(xd.begin() + axis + 1, xd.end()));
  const int64_t n = xd[axis];
  int64_t j = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < idx.num_elements(); ++k) {
      int64_t i = GetInt(idx, k);
      if (i < 0) i += n;
      if (i < 0 || i >= n) {
        return c.Invalid(absl::StrCat("index ", GetInt(idx, k), " is out of range for dim ", n));
      }
      for (int64_t e = 0; e < inner; ++e) b.Copy(j++, x, (o * n + i) * inner + e);
    }
  }
  c.SetKnown(0, b.Done());
  return true;
}

absl::StatusOr<bool> FoldSlice(Importer& c) {
  const Known& x = K(c, 0);
  const int64_t rank = x.t->rank();
  if (c.opset() >= 10) {
    for (int i = 1; i < c.num_inputs(); ++i) {
      if (c.has(i) && !K(c, i).complete()) return false;
    }
  }
  KILN_ASSIGN_OR_RETURN(Importer::SliceArgs args, c.SliceOperands());
  std::vector<int64_t>& starts = args.starts;
  std::vector<int64_t>& ends = args.ends;
  std::vector<int64_t>& axes = args.axes;
  std::vector<int64_t>& steps = args.steps;
  const Dims& xd = x.t->dims();
  std::vector<std::vector<int64_t>> pick(rank);
  for (int64_t k = 0; k < rank; ++k) {
    pick[k].resize(xd[k]);
    std::iota(pick[k].begin(), pick[k].end(), 0);
  }
  for (size_t i = 0; i < starts.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, NormAxis(c, axes[i], rank));
    const int64_t n = xd[ax], step = steps[i];
    if (step == 0) return c.Invalid("slice step 0");
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += n;
    if (e < 0) e += n;
    pick[ax].clear();
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, n);
      e = std::clamp<int64_t>(e, 0, n);
      for (int64_t v = s; v < e; v += step) pick[ax].push_back(v);
    } else {
      s = std::clamp<int64_t>(s, -1, n - 1);
      e = std::clamp<int64_t>(e, -1, n - 1);
      for (int64_t v = s; v > e; v += step) pick[ax].push_back(v);
    }
  }
  Dims out(rank);
  for (int64_t k = 0; k < rank; ++k) out[k] = static_cast<int64_t>(pick[k].size());
  KILN_ASSIGN_OR_RETURN(Builder b, Builder::Make(x.t->dtype(), out));
  const Dims xs = Strides(xd), os = Strides(out);
  for (int64_t j = 0; j < b.t.num_elements(); ++j) {
    int64_t src = 0;
    for (int64_t k = 0; k < rank; ++k) src += pick[k][(j / os[k]) % out[k]] * xs[k];
    b.Copy(j, x, src);
  }
  c.SetKnown(0, b.Done());
  return true;
}

// Elementwise over broadcast inputs: `f` gets the input values (int64 for
// integer and bool inputs, else double in `fv`) and writes the result.
enum class Arith { kInt, kFloat };

absl::StatusOr<bool> FoldElementwise(Importer& c, DType out_dtype,
                                     const std::function<bool(const std::vector<int64_t>&,
                                                              const std::vector<double>&,
                                                              int64_t*, double*)>& f) {
  std::vector<const Dims*> dims;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i)) return false;
    dims.push_back(&K(c, i).t->dims());
  }
  Dims out;
  if (!Broadcast(dims, &out)) return c.Invalid("operands do not broadcast");
  KILN_ASSIGN_OR_RETURN(Builder b, Builder::Make(out_dtype, out));
  const bool int_out = IsInteger(out_dtype) || out_dtype == v1::DTYPE_BOOL;
  std::vector<int64_t> iv(c.num_inputs());
  std::vector<double> fv(c.num_inputs());
  for (int64_t j = 0; j < b.t.num_elements(); ++j) {
    bool unknown = false;
    for (int i = 0; i < c.num_inputs(); ++i) {
      const Known& x = K(c, i);
      const int64_t s = BroadcastSource(j, out, x.t->dims());
      if (SymAt(x, s)) unknown = true;
      const bool is_int = IsInteger(x.t->dtype()) || x.t->dtype() == v1::DTYPE_BOOL;
      iv[i] = is_int ? GetInt(*x.t, s) : 0;
      fv[i] = is_int ? static_cast<double>(iv[i]) : x.t->GetAsDouble(s);
    }
    if (unknown) {
      if (!IsInteger(out_dtype)) return false;
      b.MarkUnknown(j);
      continue;
    }
    int64_t ri = 0;
    double rf = 0;
    if (!f(iv, fv, &ri, &rf)) return false;
    if (int_out) {
      SetInt(b.t, j, ri);
    } else {
      b.t.SetFromDouble(j, rf);
    }
  }
  c.SetKnown(0, b.Done());
  return true;
}

bool IsIntLike(DType d) { return IsInteger(d) || d == v1::DTYPE_BOOL; }

absl::StatusOr<bool> FoldArith(Importer& c, const std::string& op) {
  // The lambdas below read a[0] and, for binary ops, a[1]: a node with another
  // input count is left to the op's own import, which names the error
  // (kiln_fuzz_onnx_import: an Add with one input read past its operands).
  const bool binary = op == "Add" || op == "Sub" || op == "Mul" || op == "Div";
  const bool unary = op == "Neg" || op == "Abs";
  if (c.num_inputs() < 1 || (binary && c.num_inputs() != 2) || (unary && c.num_inputs() != 1)) {
    return false;
  }
  const DType dt = K(c, 0).t->dtype();
  for (int i = 1; i < c.num_inputs(); ++i) {
    if (!c.has(i) || K(c, i).t->dtype() != dt) return false;
  }
  const bool ints = IsIntLike(dt);
  return FoldElementwise(c, dt, [&](const std::vector<int64_t>& a, const std::vector<double>& x,
                                    int64_t* ri, double* rf) {
    if (ints) {
      CheckedInt r = a[0];
      if (op == "Add") r = CheckedInt(a[0]) + a[1];
      else if (op == "Sub") r = CheckedInt(a[0]) - a[1];
      else if (op == "Mul") r = CheckedInt(a[0]) * a[1];
      else if (op == "Div") r = CheckedInt(a[0]) / a[1];
      else if (op == "Neg") r = CheckedInt(0) - a[0];
      else if (op == "Abs") r = a[0] < 0 ? CheckedInt(0) - a[0] : CheckedInt(a[0]);
      else if (op == "Max" || op == "Min") {
        int64_t v = a[0];
        for (size_t i = 1; i < a.size(); ++i) v = op == "Max" ? std::max(v, a[i]) : std::min(v, a[i]);
        r = v;
      } else {
        return false;
      }
      if (!r.ok()) return false;
      *ri = r.get();
      return true;
    }
    if (op == "Add") *rf = x[0] + x[1];
    else if (op == "Sub") *rf = x[0] - x[1];
    else if (op == "Mul") *rf = x[0] * x[1];
    else if (op == "Div") *rf = x[0] / x[1];
    else if (op == "Neg") *rf = -x[0];
    else if (op == "Abs") *rf = std::fabs(x[0]);
    else return false;
    return true;
  });
}

absl::StatusOr<bool> FoldCompare(Importer& c, const std::string& op) {
  if (c.num_inputs() != 2 || !c.has(1) || K(c, 0).t->dtype() != K(c, 1).t->dtype()) return false;
  const bool ints = IsIntLike(K(c, 0).t->dtype());
  return FoldElementwise(c, v1::DTYPE_BOOL, [&](const std::vector<int64_t>& a,
                                               const std::vector<double>& x, int64_t* ri, double*) {
    bool r;
    auto cmp = [&](auto u, auto v) {
      if (op == "Equal") return u == v;
      if (op == "Less") return u < v;
      if (op == "Greater") return u > v;
      if (op == "LessOrEqual") return u <= v;
      return u >= v;
    };
    r = ints ? cmp(a[0], a[1]) : cmp(x[0], x[1]);
    *ri = r;
    return true;
  });
}

absl::StatusOr<bool> FoldWhere(Importer& c) {
  if (c.num_inputs() != 3 || K(c, 1).t->dtype() != K(c, 2).t->dtype() || !K(c, 0).complete()) {
    return false;
  }
  const DType dt = K(c, 1).t->dtype();
  const bool ints = IsIntLike(dt);
  // Symbolic elements pass through a where: pick them per element.
  std::vector<const Dims*> dims = {&K(c, 0).t->dims(), &K(c, 1).t->dims(), &K(c, 2).t->dims()};
  Dims out;
  if (!Broadcast(dims, &out)) return c.Invalid("operands do not broadcast");
  KILN_ASSIGN_OR_RETURN(Builder b, Builder::Make(dt, out));
  for (int64_t j = 0; j < b.t.num_elements(); ++j) {
    const bool cond = GetInt(*K(c, 0).t, BroadcastSource(j, out, K(c, 0).t->dims())) != 0;
    const Known& src = K(c, cond ? 1 : 2);
    b.Copy(j, src, BroadcastSource(j, out, src.t->dims()));
  }
  (void)ints;
  c.SetKnown(0, b.Done());
  return true;
}

absl::StatusOr<bool> FoldConstantOfShape(Importer& c) {
  if (!K(c, 0).complete()) return false;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, c.RequiredInts(0));
  CheckedInt n = 1;
  for (int64_t d : shape) {
    if (d < 0) return c.Invalid(absl::StrCat("negative dim in shape [", absl::StrJoin(shape, ", "), "]"));
    n = n * d;
  }
  if (!n.ok()) return c.Invalid(absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] overflows int64"));
  if (n.get() > c.options().max_folded_elements) return false;
  HostTensor value = HostTensor::FromVector<float>(v1::DTYPE_F32, {1}, {0.f});
  if (const auto* a = c.Attr("value")) {
    KILN_ASSIGN_OR_RETURN(value, TensorFromProto(a->t(), c.options().limits));
    if (value.num_elements() != 1) return c.Invalid("attribute value must have one element");
  }
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(value.dtype(), Dims(shape.begin(), shape.end())));
  const int64_t es = ElementSize(value.dtype());
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    std::memcpy(static_cast<char*>(t.data()) + i * es, value.data(), es);
  }
  KILN_RETURN_IF_ERROR(c.SetConst(0, std::move(t)));
  return true;
}

absl::StatusOr<bool> FoldRange(Importer& c) {
  for (int i = 0; i < 3; ++i) {
    if (!c.has(i) || !K(c, i).complete() || K(c, i).t->num_elements() != 1) return false;
  }
  const DType dt = K(c, 0).t->dtype();
  const bool ints = IsInteger(dt);
  const double start = K(c, 0).t->GetAsDouble(0), limit = K(c, 1).t->GetAsDouble(0),
               delta = K(c, 2).t->GetAsDouble(0);
  if (delta == 0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta)) {
    return c.Invalid("Range needs a finite, nonzero delta and finite bounds");
  }
  const double count = std::max(std::ceil((limit - start) / delta), 0.0);
  if (count > static_cast<double>(c.options().max_folded_elements)) return false;
  const int64_t n = static_cast<int64_t>(count);
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(dt, {n}));
  if (ints) {
    const int64_t s = GetInt(*K(c, 0).t, 0), d = GetInt(*K(c, 2).t, 0);
    for (int64_t i = 0; i < n; ++i) SetInt(t, i, s + i * d);
  } else {
    // As the reference: accumulate in the tensor's own type.
    const float s = static_cast<float>(start), d = static_cast<float>(delta);
    for (int64_t i = 0; i < n; ++i) {
      t.SetFromDouble(i, dt == v1::DTYPE_F64 ? start + static_cast<double>(i) * delta
                                             : static_cast<double>(s + static_cast<float>(i) * d));
    }
  }
  KILN_RETURN_IF_ERROR(c.SetConst(0, std::move(t)));
  return true;
}

// Reductions of small integer vectors (the element count of a shape slice).
absl::StatusOr<bool> FoldReduce(Importer& c, const std::string& op) {
  const Known& x = K(c, 0);
  if (!x.complete() || !IsInteger(x.t->dtype()) || x.t->rank() > 1) return false;
  if (c.num_inputs() > 1 || c.Attr("axes") != nullptr) {
    // Only the full reduction of a vector is folded here.
    auto axes = c.opset() >= 18 || (op == "ReduceSum" && c.opset() >= 13) ? c.Ints(1)
                                                                            : c.AttrInts("axes");
    if (!axes.ok() || (*axes && !(**axes).empty() && (**axes != std::vector<int64_t>{0} &&
                                                      **axes != std::vector<int64_t>{-1}))) {
      return false;
    }
  }
  const bool keep = c.AttrInt("keepdims", 1) != 0;
  CheckedInt r = op == "ReduceProd" ? 1 : 0;
  for (int64_t i = 0; i < x.t->num_elements(); ++i) {
    const int64_t v = GetInt(*x.t, i);
    r = op == "ReduceProd" ? r * v : r + v;
  }
  if (!r.ok()) return false;
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(x.t->dtype(), keep && x.t->rank() == 1 ? Dims{1} : Dims{}));
  SetInt(t, 0, r.get());
  KILN_RETURN_IF_ERROR(c.SetConst(0, std::move(t)));
  return true;
}

absl::StatusOr<bool> TryFoldImpl(Importer& c);

}  // namespace

absl::StatusOr<bool> TryFold(Importer& c) {
  auto r = TryFoldImpl(c);
  if (!r.ok() && absl::IsOutOfRange(r.status())) return false;
  return r;
}

namespace {

absl::StatusOr<bool> TryFoldImpl(Importer& c) {
  const std::string& op = c.node().op_type();
  if (op == "Constant") return FoldConstant(c);
  if (op == "Shape") return FoldShape(c);
  if (op == "Size") return FoldSize(c);
  if (c.num_inputs() == 0 || !c.has(0) || !AllKnown(c)) return false;
  // Only the first output of any node is folded (Dropout's mask is not).
  for (int i = 1; i < c.num_outputs(); ++i) {
    if (c.wants(i)) return false;
  }
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i)) continue;
    const HostTensor& t = *c.in(i).known->t;
    if (t.num_elements() > c.options().max_folded_elements) return false;
    // Empty multi-dim tensors are no shape arithmetic; their other dims are
    // unbounded (and index products over them could overflow).
    if (t.num_elements() == 0 && t.rank() > 1) return false;
  }
  const Known& x = K(c, 0);
  const Dims& xd = x.t->dims();
  if (op == "Identity" || op == "Dropout") return Relabel(c, xd);
  if (op == "Cast") {
    auto to = DTypeFromOnnx(static_cast<int32_t>(c.AttrInt("to", 0)));
    if (!to) return false;
    return FoldCast(c, *to);
  }
  if (op == "Unsqueeze") {
    KILN_ASSIGN_OR_RETURN(auto axes, c.IntsAttrOrInput("axes", 13, 1));
    if (!axes) return false;
    const int64_t rank = x.t->rank() + static_cast<int64_t>(axes->size());
    Dims out(rank, -1);
    for (int64_t a : *axes) {
      KILN_ASSIGN_OR_RETURN(int64_t ax, NormAxis(c, a, rank));
      out[ax] = 1;
    }
    size_t k = 0;
    for (auto& d : out) {
      if (d == -1) {
        if (k >= xd.size()) return c.Invalid("repeated axes");
        d = xd[k++];
      }
    }
    return Relabel(c, out);
  }
  if (op == "Squeeze") {
    KILN_ASSIGN_OR_RETURN(auto axes, c.IntsAttrOrInput("axes", 13, 1));
    Dims out;
    std::vector<bool> drop(xd.size(), false);
    if (!axes || axes->empty()) {
      for (size_t k = 0; k < xd.size(); ++k) drop[k] = xd[k] == 1;
    } else {
      for (int64_t a : *axes) {
        KILN_ASSIGN_OR_RETURN(int64_t ax, NormAxis(c, a, x.t->rank()));
        drop[ax] = true;
      }
    }
    for (size_t k = 0; k < xd.size(); ++k) {
      if (!drop[k]) out.push_back(xd[k]);
    }
    return Relabel(c, out);
  }
  if (op == "Reshape" && c.opset() >= 5) {
    if (!c.has(1) || !K(c, 1).complete()) return false;
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, c.RequiredInts(1));
    const bool allowzero = c.AttrInt("allowzero", 0) != 0;
    Dims out;
    int infer = -1;
    int64_t known = 1;
    for (size_t k = 0; k < shape.size(); ++k) {
      int64_t d = shape[k];
      if (d == 0 && !allowzero) {
        if (k >= xd.size()) return c.Invalid("reshape 0 past the input's rank");
        d = xd[k];
      }
      if (d == -1) {
        infer = static_cast<int>(k);
        out.push_back(1);
        continue;
      }
      if (d < 0) return c.Invalid("negative reshape dim");
      known *= d;
      out.push_back(d);
    }
    if (infer >= 0) {
      if (known == 0) return false;
      out[infer] = x.t->num_elements() / known;
    }
    return Relabel(c, out);
  }
  if (op == "Flatten") {
    int64_t axis = c.AttrInt("axis", 1);
    if (axis < 0) axis += x.t->rank();
    if (axis < 0 || axis > x.t->rank()) return c.Invalid(absl::StrCat("axis ", axis, " is out of range"));
    return Relabel(c, {Count(Dims(xd.begin(), xd.begin() + axis)), Count(Dims(xd.begin() + axis, xd.end()))});
  }
  if (op == "Concat") return FoldConcat(c);
  if (op == "Gather") return FoldGather(c);
  if (op == "Slice") return FoldSlice(c);
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Neg" || op == "Abs" ||
      op == "Max" || op == "Min") {
    return FoldArith(c, op);
  }
  if (op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" ||
      op == "GreaterOrEqual") {
    return FoldCompare(c, op);
  }
  if (op == "Not" && x.complete()) {
    return FoldElementwise(c, v1::DTYPE_BOOL, [](const std::vector<int64_t>& a,
                                                 const std::vector<double>&, int64_t* r, double*) {
      *r = a[0] == 0;
      return true;
    });
  }
  if (op == "Where") return FoldWhere(c);
  // Float scalar arithmetic of a trip count (the Range function body:
  // Relu(Ceil((limit - start) / delta))); exact, so folding matches the kernels.
  if ((op == "Ceil" || op == "Floor" || op == "Relu") && c.num_inputs() == 1 && x.complete() &&
      IsFloat(x.t->dtype())) {
    return FoldElementwise(c, x.t->dtype(), [&](const std::vector<int64_t>&, const std::vector<double>& v,
                                                int64_t*, double* r) {
      if (op == "Ceil") *r = std::ceil(v[0]);
      else if (op == "Floor") *r = std::floor(v[0]);
      else *r = v[0] < 0 ? 0.0 : v[0];  // NaN stays NaN
      return true;
    });
  }
  if (op == "ConstantOfShape") return FoldConstantOfShape(c);
  if (op == "Range") return FoldRange(c);
  if (op == "ReduceProd" || op == "ReduceSum") return FoldReduce(c, op);
  return false;
}

}  // namespace
}  // namespace kiln::io::onnx_internal
