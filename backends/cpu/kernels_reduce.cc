// Reduce (sum, mean, max, min, prod over any axes), ArgMax and Cumsum.
//
// Every reduction is brought to [outer, R, inner] (R reduced): axes are
// collapsed, and when the reduced axes are not one contiguous group the input
// is transposed first so that they are. Float sums and products accumulate in
// f64, integer ones wrap in u64 (the dtype's two's complement), max/min
// propagate NaN as NumPy does. Work splits over outer rows, inner columns and,
// when those are too few for the threads, over chunks of R whose partial
// results are combined at the end. f16/bf16 are widened to f32 first.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/transpose.h"

namespace kiln::cpu {
namespace {

using backend::Claim;
using backend::KernelSpec;
using KernelOr = absl::StatusOr<std::unique_ptr<backend::Kernel>>;

// ---- Accumulation rules.

template <typename A>
struct SumOp {
  static A Init() { return A(0); }
  static A Apply(A a, A x) { return a + x; }
};
template <typename A>
struct ProdOp {
  static A Init() { return A(1); }
  static A Apply(A a, A x) { return a * x; }
};
template <typename A>
struct MaxOp {
  static A Init() {
    return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                : std::numeric_limits<A>::lowest();
  }
  // NaN wins: x NaN is taken; an accumulated NaN is never replaced.
  static A Apply(A a, A x) { return (x > a || IsNanValue(x)) ? x : a; }
};
template <typename A>
struct MinOp {
  static A Init() {
    return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity()
                                                : std::numeric_limits<A>::max();
  }
  static A Apply(A a, A x) { return (x < a || IsNanValue(x)) ? x : a; }
};

// Row fold with 8 independent lanes so the loop vectorizes.
template <typename T, typename A, typename Op>
A FoldRow(const T* x, int64_t n) {
  A acc[8];
  for (A& a : acc) a = Op::Init();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = Op::Apply(acc[l], static_cast<A>(x[i + l]));
  }
  for (; i < n; ++i) acc[0] = Op::Apply(acc[0], static_cast<A>(x[i]));
  for (int l = 1; l < 8; ++l) acc[0] = Op::Apply(acc[0], acc[l]);
  return acc[0];
}

struct Shape3 {
  int64_t outer, r, inner;
};

// out[o, i] = fold over r of x[o, r, i], then finalize (mean divides).
template <typename T, typename A, typename Op>
void ReduceT(const T* x, T* out, Shape3 s, bool mean) {
  const int64_t threads = omp_get_max_threads();
  constexpr int64_t kCols = 256;
  const int64_t col_chunks = (s.inner + kCols - 1) / kCols;
  // Split R when the outer x column units cannot keep the threads busy.
  int64_t nr = 1;
  if (s.outer * col_chunks < 2 * threads && s.r * s.inner >= (int64_t{1} << 15)) {
    nr = std::min<int64_t>(4 * threads, std::max<int64_t>(1, s.r / 64));
  }
  std::vector<A> partial(nr * s.outer * s.inner);
  const int64_t units = nr * s.outer * col_chunks;
  const int64_t work = s.r / nr * std::min(s.inner, kCols);
  ParallelFor(units, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(work, 1)),
              [&](int64_t begin, int64_t end) {
                for (int64_t u = begin; u < end; ++u) {
                  const int64_t c = u % col_chunks, o = (u / col_chunks) % s.outer,
                                k = u / (col_chunks * s.outer);
                  const int64_t r0 = s.r * k / nr, r1 = s.r * (k + 1) / nr;
                  A* acc = partial.data() + (k * s.outer + o) * s.inner;
                  if (s.inner == 1) {
                    acc[0] = FoldRow<T, A, Op>(x + o * s.r + r0, r1 - r0);
                    continue;
                  }
                  const int64_t i0 = c * kCols, i1 = std::min(s.inner, i0 + kCols);
                  for (int64_t i = i0; i < i1; ++i) acc[i] = Op::Init();
                  for (int64_t r = r0; r < r1; ++r) {
                    const T* row = x + (o * s.r + r) * s.inner;
                    for (int64_t i = i0; i < i1; ++i)
                      acc[i] = Op::Apply(acc[i], static_cast<A>(row[i]));
                  }
                }
              });
  const int64_t n = s.outer * s.inner;
  for (int64_t e = 0; e < n; ++e) {
    A a = partial[e];
    for (int64_t k = 1; k < nr; ++k) a = Op::Apply(a, partial[k * n + e]);
    if (mean) a = static_cast<A>(a / static_cast<A>(s.r));
    out[e] = static_cast<T>(a);
  }
}

// out[k] = fold over a and c of x[a, k, c]: [R0, K, R2] with both ends
// reduced (a conv's bias gradient, [N, C, H * W] summed to [C]), read in
// place: row k of each slice a is contiguous, so no transpose is needed.
template <typename T, typename A, typename Op>
void ReduceOuterAndInner(const T* x, T* out, int64_t r0, int64_t k, int64_t r2, bool mean) {
  ParallelFor(k, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(r0 * r2, 1)),
              [&](int64_t begin, int64_t end) {
                for (int64_t j = begin; j < end; ++j) {
                  A acc = Op::Init();
                  for (int64_t a = 0; a < r0; ++a)
                    acc = Op::Apply(acc, FoldRow<T, A, Op>(x + (a * k + j) * r2, r2));
                  if (mean) acc = static_cast<A>(acc / static_cast<A>(r0 * r2));
                  out[j] = static_cast<T>(acc);
                }
              });
}

template <typename T, typename A>
void ReduceKind(int kind, const T* x, T* out, Shape3 s) {
  switch (kind) {
    case v1::REDUCE_SUM:
      ReduceT<T, A, SumOp<A>>(x, out, s, false);
      return;
    case v1::REDUCE_MEAN:
      ReduceT<T, A, SumOp<A>>(x, out, s, true);
      return;
    case v1::REDUCE_PROD:
      ReduceT<T, A, ProdOp<A>>(x, out, s, false);
      return;
    default:
      return;
  }
}

template <typename T, typename M>
void ReduceAny(int kind, const T* x, T* out, Shape3 s) {
  if (kind == v1::REDUCE_MAX) return ReduceT<T, M, MaxOp<M>>(x, out, s, false);
  if (kind == v1::REDUCE_MIN) return ReduceT<T, M, MinOp<M>>(x, out, s, false);
  if constexpr (std::is_floating_point_v<T>) {
    ReduceKind<T, double>(kind, x, out, s);
  } else {
    ReduceKind<T, uint64_t>(kind, x, out, s);  // wraps like the dtype
  }
}

void ReduceDispatch(int kind, DType dt, const void* x, void* out, Shape3 s) {
  switch (dt) {
    case v1::DTYPE_F32:
      ReduceAny<float, float>(kind, static_cast<const float*>(x), static_cast<float*>(out), s);
      return;
    case v1::DTYPE_F64:
      ReduceAny<double, double>(kind, static_cast<const double*>(x), static_cast<double*>(out), s);
      return;
    case v1::DTYPE_I8:
      ReduceAny<int8_t, int64_t>(kind, static_cast<const int8_t*>(x), static_cast<int8_t*>(out), s);
      return;
    case v1::DTYPE_U8:
      ReduceAny<uint8_t, int64_t>(kind, static_cast<const uint8_t*>(x), static_cast<uint8_t*>(out),
                                  s);
      return;
    case v1::DTYPE_I16:
      ReduceAny<int16_t, int64_t>(kind, static_cast<const int16_t*>(x), static_cast<int16_t*>(out),
                                  s);
      return;
    case v1::DTYPE_I32:
      ReduceAny<int32_t, int64_t>(kind, static_cast<const int32_t*>(x), static_cast<int32_t*>(out),
                                  s);
      return;
    case v1::DTYPE_I64:
      ReduceAny<int64_t, int64_t>(kind, static_cast<const int64_t*>(x), static_cast<int64_t*>(out),
                                  s);
      return;
    default:
      return;
  }
}

template <typename T>
void ReduceOuterAndInnerKind(int kind, const T* x, T* out, int64_t r0, int64_t k, int64_t r2) {
  switch (kind) {
    case v1::REDUCE_SUM:
    case v1::REDUCE_MEAN:
      return ReduceOuterAndInner<T, double, SumOp<double>>(x, out, r0, k, r2,
                                                           kind == v1::REDUCE_MEAN);
    case v1::REDUCE_PROD:
      return ReduceOuterAndInner<T, double, ProdOp<double>>(x, out, r0, k, r2, false);
    case v1::REDUCE_MAX:
      return ReduceOuterAndInner<T, T, MaxOp<T>>(x, out, r0, k, r2, false);
    case v1::REDUCE_MIN:
      return ReduceOuterAndInner<T, T, MinOp<T>>(x, out, r0, k, r2, false);
    default:
      return;
  }
}

// f16/bf16 as f32 for the length of a launch.
std::vector<float> Widen(const void* x, DType dt, int64_t n) {
  std::vector<float> w(n);
  ParallelFor(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    WidenRow(static_cast<const char*>(x) + b * 2, dt, e - b, w.data() + b);
  });
  return w;
}

// ---- Reduce.

struct ReducePlan {
  int kind = 0;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  Dims dims;                  // collapsed input dims
  std::vector<int64_t> perm;  // empty, or the transpose that gathers reduced axes last
  Shape3 shape{1, 1, 1};
  bool empty_reduction = false;  // a reduced axis has size 0: identity fill
  // f32 / f64 dims [R0, K, R2] with R0 and R2 reduced: reduced in place
  // (ReduceOuterAndInner) instead of through `perm`.
  bool outer_and_inner = false;
};

KernelOr CreateReduce(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& a = spec.attrs.reduce();
  const int64_t r = x.rank();
  std::vector<bool> reduced(r, a.axes().empty());
  for (int64_t ax : a.axes()) {
    int64_t axis;
    if (!NormalizeAxis(ax, r, &axis) || (reduced[axis] && !a.axes().empty())) {
      return SpecError(spec, "reduce axis ", ax, " is out of range or repeated for ",
                       TypeString(x));
    }
    reduced[axis] = true;
  }
  Dims out;
  bool empty_reduction = false;
  for (int64_t k = 0; k < r; ++k) {
    if (!reduced[k])
      out.push_back(x.dims[k]);
    else if (a.keepdims())
      out.push_back(1);
    if (reduced[k] && x.dims[k] == 0) empty_reduction = true;
  }
  if (auto s = CheckOutput(spec, 0, x.dtype, out); !s.ok()) return s;
  ReducePlan p;
  p.kind = a.kind();
  p.dtype = x.dtype;
  p.empty_reduction = empty_reduction;
  if (empty_reduction && (p.kind == v1::REDUCE_MAX || p.kind == v1::REDUCE_MIN)) {
    return SpecError(spec, v1::ReduceKind_Name(a.kind()), " over an empty axis has no identity");
  }
  // Collapse: size-1 axes vanish, neighbours with the same role merge.
  std::vector<bool> role;
  for (int64_t k = 0; k < r; ++k) {
    if (x.dims[k] == 1) continue;
    if (!p.dims.empty() && role.back() == reduced[k]) {
      p.dims.back() *= x.dims[k];
      continue;
    }
    p.dims.push_back(x.dims[k]);
    role.push_back(reduced[k]);
  }
  int groups = 0;
  for (bool b : role) groups += b;
  if (groups > 1) {
    for (size_t k = 0; k < role.size(); ++k)
      if (!role[k]) p.perm.push_back(k);
    for (size_t k = 0; k < role.size(); ++k)
      if (role[k]) p.perm.push_back(k);
    int64_t kept = 1, red = 1;
    for (size_t k = 0; k < role.size(); ++k) (role[k] ? red : kept) *= p.dims[k];
    p.shape = {kept, red, 1};
    p.outer_and_inner = role.size() == 3 && role[0] && role[2] &&
                        (x.dtype == v1::DTYPE_F32 || x.dtype == v1::DTYPE_F64);
  } else {
    const size_t at = std::find(role.begin(), role.end(), true) - role.begin();
    p.shape.outer = Product(p.dims, 0, std::min(at, p.dims.size()));
    p.shape.r = at < role.size() ? p.dims[at] : 1;
    p.shape.inner = at < role.size() ? Product(p.dims, at + 1, p.dims.size()) : 1;
  }
  const std::string kind = absl::AsciiStrToLower(v1::ReduceKind_Name(a.kind()).substr(7));
  const int64_t out_n = Product(out);
  return FnKernel::Make(spec, absl::StrCat("cpu:reduce_", kind, "_", DTypeName(x.dtype)),
                        [p, out_n](auto inputs, auto outputs) {
                          if (out_n == 0) return absl::OkStatus();
                          void* y = HostPtr(outputs[0]);
                          const bool half = IsF16OrBf16(p.dtype);
                          if (p.empty_reduction) {
                            const double identity = p.kind == v1::REDUCE_PROD
                                                        ? 1.0
                                                        : (p.kind == v1::REDUCE_MEAN ? NAN : 0.0);
                            uint64_t reg = 0;
                            ew::Fill(ew::ClassOf(p.dtype), p.dtype, identity, 1, &reg);
                            std::vector<char> v(ElementSize(p.dtype));
                            ew::Store(&reg, p.dtype, 1, v.data());
                            for (int64_t e = 0; e < out_n; ++e)
                              std::memcpy(static_cast<char*>(y) + e * v.size(), v.data(), v.size());
                            return absl::OkStatus();
                          }
                          const int64_t n = Product(p.dims);
                          const void* x = HostPtr(inputs[0]);
                          std::vector<float> wide;
                          DType dt = p.dtype;
                          if (half) {
                            wide = Widen(x, dt, n);
                            x = wide.data();
                            dt = v1::DTYPE_F32;
                          }
                          if (p.outer_and_inner) {
                            if (dt == v1::DTYPE_F32) {
                              ReduceOuterAndInnerKind(p.kind, static_cast<const float*>(x),
                                                      static_cast<float*>(y), p.dims[0],
                                                      p.dims[1], p.dims[2]);
                            } else {
                              ReduceOuterAndInnerKind(p.kind, static_cast<const double*>(x),
                                                      static_cast<double*>(y), p.dims[0],
                                                      p.dims[1], p.dims[2]);
                            }
                            return absl::OkStatus();
                          }
                          std::vector<char> moved;
                          if (!p.perm.empty()) {
                            moved.resize(n * ElementSize(dt));
                            TransposeBytes(x, moved.data(), p.dims, p.perm, ElementSize(dt));
                            x = moved.data();
                          }
                          if (!half) {
                            ReduceDispatch(p.kind, dt, x, y, p.shape);
                            return absl::OkStatus();
                          }
                          std::vector<float> out(out_n);
                          ReduceDispatch(p.kind, dt, x, out.data(), p.shape);
                          NarrowRow(out.data(), p.dtype, out_n, y);
                          return absl::OkStatus();
                        });
}

Claim SupportsReduce(const KernelSpec& spec) {
  if (spec.inputs.size() != 1) return Claim::No("expects one input");
  const DType dt = spec.inputs[0].dtype;
  const int kind = spec.attrs.reduce().kind();
  if (kind < v1::REDUCE_SUM || kind > v1::REDUCE_PROD) return Claim::No("unknown reduce kind");
  if (IsFloat(dt)) return Claim::Yes();
  if (IsInteger(dt) && kind != v1::REDUCE_MEAN) return Claim::Yes();
  return Claim::No(
      absl::StrCat("cpu reduces floats (every kind) and integers (sum, max, min, prod), not ",
                   v1::ReduceKind_Name(static_cast<v1::ReduceKind>(kind)), " of ", DTypeName(dt)));
}

// ---- ArgMax: first index of the maximum; the first NaN if there is one.

template <typename T, typename I>
void ArgMaxT(const T* x, I* out, Shape3 s) {
  ParallelFor(s.outer * s.inner,
              std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(s.r, 1)),
              [&](int64_t begin, int64_t end) {
                for (int64_t u = begin; u < end; ++u) {
                  const int64_t o = u / s.inner, i = u % s.inner;
                  const T* p = x + o * s.r * s.inner + i;
                  T best = p[0];
                  int64_t at = 0;
                  for (int64_t r = 1; r < s.r; ++r) {
                    const T v = p[r * s.inner];
                    if (v > best || (IsNanValue(v) && !IsNanValue(best))) best = v, at = r;
                  }
                  out[u] = static_cast<I>(at);
                }
              });
}

template <typename T>
void ArgMaxIndex(const T* x, DType index, void* out, Shape3 s) {
  if (index == v1::DTYPE_I32) return ArgMaxT(x, static_cast<int32_t*>(out), s);
  ArgMaxT(x, static_cast<int64_t*>(out), s);
}

KernelOr CreateArgMax(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& a = spec.attrs.argmax();
  int64_t axis;
  if (x.rank() == 0 || !NormalizeAxis(a.axis(), x.rank(), &axis) || x.dims[axis] == 0) {
    return SpecError(spec, "argmax axis ", a.axis(), " is out of range or empty for ",
                     TypeString(x));
  }
  const DType index = a.index_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_I64 : a.index_dtype();
  Dims out;
  for (int64_t k = 0; k < x.rank(); ++k) {
    if (k != axis)
      out.push_back(x.dims[k]);
    else if (a.keepdims())
      out.push_back(1);
  }
  if (auto s = CheckOutput(spec, 0, index, out); !s.ok()) return s;
  const AxisSplit sp = SplitAround(x.dims, axis, axis + 1);
  const Shape3 s{sp.outer, sp.n, sp.inner};
  const DType dt = x.dtype;
  return FnKernel::Make(spec, absl::StrCat("cpu:argmax_", DTypeName(dt)),
                        [=](auto inputs, auto outputs) {
                          const int64_t n = s.outer * s.r * s.inner;
                          if (s.outer * s.inner == 0) return absl::OkStatus();
                          const void* xp = HostPtr(inputs[0]);
                          void* y = HostPtr(outputs[0]);
                          switch (dt) {
                            case v1::DTYPE_F32:
                              ArgMaxIndex(static_cast<const float*>(xp), index, y, s);
                              break;
                            case v1::DTYPE_F64:
                              ArgMaxIndex(static_cast<const double*>(xp), index, y, s);
                              break;
                            case v1::DTYPE_F16:
                            case v1::DTYPE_BF16: {
                              const std::vector<float> w = Widen(xp, dt, n);
                              ArgMaxIndex(w.data(), index, y, s);
                              break;
                            }
                            case v1::DTYPE_I8:
                              ArgMaxIndex(static_cast<const int8_t*>(xp), index, y, s);
                              break;
                            case v1::DTYPE_U8:
                              ArgMaxIndex(static_cast<const uint8_t*>(xp), index, y, s);
                              break;
                            case v1::DTYPE_I16:
                              ArgMaxIndex(static_cast<const int16_t*>(xp), index, y, s);
                              break;
                            case v1::DTYPE_I32:
                              ArgMaxIndex(static_cast<const int32_t*>(xp), index, y, s);
                              break;
                            default:
                              ArgMaxIndex(static_cast<const int64_t*>(xp), index, y, s);
                              break;
                          }
                          return absl::OkStatus();
                        });
}

Claim SupportsNumbers(const KernelSpec& spec) {
  if (spec.inputs.size() != 1) return Claim::No("expects one input");
  const DType dt = spec.inputs[0].dtype;
  if (IsFloat(dt) || IsInteger(dt)) return Claim::Yes();
  return Claim::No(absl::StrCat("cpu implements this on floats and integers, not ", DTypeName(dt)));
}

Claim SupportsArgMax(const KernelSpec& spec) {
  const DType index = spec.attrs.argmax().index_dtype();
  if (index != v1::DTYPE_UNSPECIFIED && index != v1::DTYPE_I32 && index != v1::DTYPE_I64) {
    return Claim::No("argmax writes i32 or i64 indices");
  }
  return SupportsNumbers(spec);
}

// ---- Cumsum: floats accumulate in f64, integers wrap.

template <typename T, typename A>
void CumsumT(const T* x, T* y, Shape3 s, bool exclusive, bool reverse) {
  constexpr int64_t kCols = 256;
  const int64_t col_chunks = (s.inner + kCols - 1) / kCols;
  ParallelFor(s.outer * col_chunks,
              std::max<int64_t>(
                  1, (int64_t{1} << 14) / std::max<int64_t>(s.r * std::min(s.inner, kCols), 1)),
              [&](int64_t begin, int64_t end) {
                std::vector<A> acc(std::min(s.inner, kCols));
                for (int64_t u = begin; u < end; ++u) {
                  const int64_t o = u / col_chunks, i0 = (u % col_chunks) * kCols;
                  const int64_t w = std::min(kCols, s.inner - i0);
                  std::fill(acc.begin(), acc.begin() + w, A(0));
                  for (int64_t step = 0; step < s.r; ++step) {
                    const int64_t r = reverse ? s.r - 1 - step : step;
                    const int64_t off = (o * s.r + r) * s.inner + i0;
                    for (int64_t i = 0; i < w; ++i) {
                      const A v =
                          static_cast<A>(x[off + i]);  // NOLINT(bugprone-signed-char-misuse)
                      if (exclusive) y[off + i] = static_cast<T>(acc[i]);
                      acc[i] += v;
                      if (!exclusive) y[off + i] = static_cast<T>(acc[i]);
                    }
                  }
                }
              });
}

KernelOr CreateCumsum(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& a = spec.attrs.cumsum();
  int64_t axis;
  if (x.rank() == 0 || !NormalizeAxis(a.axis(), x.rank(), &axis)) {
    return SpecError(spec, "cumsum axis ", a.axis(), " out of range for ", TypeString(x));
  }
  if (auto s = CheckOutput(spec, 0, x.dtype, x.dims); !s.ok()) return s;
  const AxisSplit sp = SplitAround(x.dims, axis, axis + 1);
  const Shape3 s{sp.outer, sp.n, sp.inner};
  const DType dt = x.dtype;
  const bool ex = a.exclusive(), rev = a.reverse();
  return FnKernel::Make(spec, absl::StrCat("cpu:cumsum_", DTypeName(dt)),
                        [=](auto inputs, auto outputs) {
                          const int64_t n = s.outer * s.r * s.inner;
                          if (n == 0) return absl::OkStatus();
                          const void* xp = HostPtr(inputs[0]);
                          void* y = HostPtr(outputs[0]);
                          switch (dt) {
                            case v1::DTYPE_F32:
                              CumsumT<float, double>(static_cast<const float*>(xp),
                                                     static_cast<float*>(y), s, ex, rev);
                              break;
                            case v1::DTYPE_F64:
                              CumsumT<double, double>(static_cast<const double*>(xp),
                                                      static_cast<double*>(y), s, ex, rev);
                              break;
                            case v1::DTYPE_F16:
                            case v1::DTYPE_BF16: {
                              const std::vector<float> w = Widen(xp, dt, n);
                              std::vector<float> out(n);
                              CumsumT<float, double>(w.data(), out.data(), s, ex, rev);
                              NarrowRow(out.data(), dt, n, y);
                              break;
                            }
                            case v1::DTYPE_I8:
                              CumsumT<int8_t, uint64_t>(static_cast<const int8_t*>(xp),
                                                        static_cast<int8_t*>(y), s, ex, rev);
                              break;
                            case v1::DTYPE_U8:
                              CumsumT<uint8_t, uint64_t>(static_cast<const uint8_t*>(xp),
                                                         static_cast<uint8_t*>(y), s, ex, rev);
                              break;
                            case v1::DTYPE_I16:
                              CumsumT<int16_t, uint64_t>(static_cast<const int16_t*>(xp),
                                                         static_cast<int16_t*>(y), s, ex, rev);
                              break;
                            case v1::DTYPE_I32:
                              CumsumT<int32_t, uint64_t>(static_cast<const int32_t*>(xp),
                                                         static_cast<int32_t*>(y), s, ex, rev);
                              break;
                            default:
                              CumsumT<int64_t, uint64_t>(static_cast<const int64_t*>(xp),
                                                         static_cast<int64_t*>(y), s, ex, rev);
                              break;
                          }
                          return absl::OkStatus();
                        });
}

const CpuOpRegistration kRegistration({
    {v1::OP_REDUCE, SupportsReduce, CreateReduce},
    {v1::OP_ARGMAX, SupportsArgMax, CreateArgMax},
    {v1::OP_CUMSUM, SupportsNumbers, CreateCumsum},
});

}  // namespace
}  // namespace kiln::cpu
