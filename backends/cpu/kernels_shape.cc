// Shape ops: Reshape, Copy, Slice, Concat, Expand, Pad, Gather. All move
// bytes (any dense dtype; Reshape and Copy also block-quantized data), in
// rows of contiguous memory wherever the layout allows, in parallel over rows
// when large. Transpose lives in kernels_transpose.cc.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"

namespace kiln::cpu {
namespace {

using backend::BufferView;
using backend::Claim;
using backend::KernelSpec;
using KernelOr = absl::StatusOr<std::unique_ptr<backend::Kernel>>;

constexpr int64_t kRowGrainBytes = int64_t{1} << 16;

int64_t RowGrain(int64_t row_bytes) {
  return std::max<int64_t>(1, kRowGrainBytes / std::max<int64_t>(row_bytes, 1));
}

// Copies `count` elements of `esize` bytes from src (stride `step` elements)
// to contiguous dst.
void StridedCopy(const char* src, int64_t step, int64_t count, int64_t esize, char* dst) {
  if (step == 1) {
    std::memcpy(dst, src, count * esize);
    return;
  }
  auto copy = [&](auto tag) {
    using T = decltype(tag);
    const T* s = reinterpret_cast<const T*>(src);
    T* d = reinterpret_cast<T*>(dst);
    for (int64_t i = 0; i < count; ++i) d[i] = s[i * step];
  };
  switch (esize) {
    case 1:
      copy(uint8_t{});
      return;
    case 2:
      copy(uint16_t{});
      return;
    case 4:
      copy(uint32_t{});
      return;
    case 8:
      copy(uint64_t{});
      return;
    default:
      for (int64_t i = 0; i < count; ++i)
        std::memcpy(dst + i * esize, src + i * step * esize, esize);
  }
}

// Writes `count` copies of one element.
void FillElement(char* dst, int64_t count, const char* elem, int64_t esize) {
  auto fill = [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, elem, sizeof(T));
    std::fill(reinterpret_cast<T*>(dst), reinterpret_cast<T*>(dst) + count, v);
  };
  switch (esize) {
    case 1:
      fill(uint8_t{});
      return;
    case 2:
      fill(uint16_t{});
      return;
    case 4:
      fill(uint32_t{});
      return;
    case 8:
      fill(uint64_t{});
      return;
    default:
      for (int64_t i = 0; i < count; ++i) std::memcpy(dst + i * esize, elem, esize);
  }
}

// Rows of the output of rank r (row = the last axis), with an odometer that
// yields each row's input offset: calls fn(row, src_offset_elements) for rows
// [begin, end). `stride[a]` is the input stride of output axis a.
template <typename Fn>
void ForRows(const Dims& out, const std::vector<int64_t>& stride, int64_t begin, int64_t end,
             Fn&& fn) {
  const int64_t r = static_cast<int64_t>(out.size());
  std::vector<int64_t> idx(std::max<int64_t>(r - 1, 0));
  int64_t rem = begin, src = 0;
  for (int64_t a = r - 2; a >= 0; --a) {
    idx[a] = rem % out[a];
    rem /= out[a];
    src += idx[a] * stride[a];
  }
  for (int64_t row = begin; row < end; ++row) {
    fn(row, src);
    for (int64_t a = r - 2; a >= 0; --a) {
      src += stride[a];
      if (++idx[a] < out[a]) break;
      src -= out[a] * stride[a];
      idx[a] = 0;
    }
  }
}

// ---- Reshape and Copy: the bytes as they are.

KernelOr CreateCopyLike(const KernelSpec& spec, const char* what) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& y = spec.outputs[0];
  if (spec.op == v1::OP_COPY) {
    if (auto s = CheckOutput(spec, 0, x.dtype, x.dims); !s.ok()) return s;
  } else {
    const auto& shape = spec.attrs.reshape().shape();
    Dims want;
    int64_t known = 1, infer_at = -1;
    for (int i = 0; i < shape.size(); ++i) {
      if (shape[i] == -1 && infer_at < 0) {
        infer_at = i;
        want.push_back(0);
        continue;
      }
      if (shape[i] < 0) return SpecError(spec, "reshape dim ", shape[i], " is negative");
      known *= shape[i];
      want.push_back(shape[i]);
    }
    if (infer_at >= 0) want[infer_at] = known == 0 ? 0 : x.num_elements() / known;
    if (Product(want) != x.num_elements()) {
      return SpecError(spec, "cannot reshape ", TypeString(x), " to ", DimsToString(want));
    }
    if (auto s = CheckOutput(spec, 0, x.dtype, want); !s.ok()) return s;
  }
  const int64_t bytes = y.num_bytes();
  return FnKernel::Make(spec, absl::StrCat("cpu:", what), [bytes](auto inputs, auto outputs) {
    if (bytes > 0 && HostPtr(inputs[0]) != HostPtr(outputs[0])) {
      ParallelMemcpy(HostPtr(outputs[0]), HostPtr(inputs[0]), bytes);
    }
    return absl::OkStatus();
  });
}

KernelOr CreateReshape(const KernelSpec& spec) { return CreateCopyLike(spec, "reshape"); }
KernelOr CreateCopy(const KernelSpec& spec) { return CreateCopyLike(spec, "copy"); }

Claim SupportsBytes(const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || !IsKnownDType(spec.inputs[0].dtype)) {
    return Claim::No("expects one tensor of a known dtype");
  }
  return Claim::Yes();
}

Claim SupportsDense(const KernelSpec& spec) {
  if (spec.inputs.empty()) return Claim::No("expects at least one input");
  if (!IsDense(spec.inputs[0].dtype)) {
    return Claim::No(absl::StrCat("cpu moves dense elements; ", DTypeName(spec.inputs[0].dtype),
                                  " is block-quantized (reshape or copy it whole)"));
  }
  return Claim::Yes();
}

// ---- Slice.

KernelOr CreateSlice(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& a = spec.attrs.slice();
  const int64_t r = x.rank();
  const int n = a.axes().empty() ? static_cast<int>(r) : a.axes_size();
  if (a.start_size() != n || a.stop_size() != n || (a.step_size() != 0 && a.step_size() != n)) {
    return SpecError(spec, "start/stop/step need one entry per sliced axis (", n, ")");
  }
  std::vector<int64_t> start(r, 0), step(r, 1);
  Dims count = x.dims;
  for (int i = 0; i < n; ++i) {
    int64_t axis = i;
    if (!a.axes().empty() && !NormalizeAxis(a.axes(i), r, &axis)) {
      return SpecError(spec, "slice axis ", a.axes(i), " out of range for rank ", r);
    }
    const int64_t dim = x.dims[axis];
    const int64_t st = a.step().empty() ? 1 : a.step(i);
    if (st < 1) return SpecError(spec, "slice step ", st, " must be >= 1");
    auto clampi = [dim](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + dim : v, 0, dim); };
    const int64_t b = clampi(a.start(i)), e = clampi(a.stop(i));
    start[axis] = b;
    step[axis] = st;
    count[axis] = e > b ? (e - b + st - 1) / st : 0;
  }
  if (auto s = CheckOutput(spec, 0, x.dtype, count); !s.ok()) return s;
  // Trailing axes taken whole merge into one wide element.
  int64_t esize = ElementSize(x.dtype);
  int64_t last = r - 1;
  while (last >= 0 && start[last] == 0 && step[last] == 1 && count[last] == x.dims[last]) {
    esize *= x.dims[last];
    --last;
  }
  const int64_t total = Product(count);
  Dims out(count.begin(), count.begin() + (last + 1));
  std::vector<int64_t> stride(last + 1, 1);
  int64_t base = 0;
  for (int64_t k = last - 1; k >= 0; --k) stride[k] = stride[k + 1] * x.dims[k + 1];
  for (int64_t k = 0; k <= last; ++k) base += start[k] * stride[k];
  std::vector<int64_t> out_stride(stride.size());
  for (size_t k = 0; k < stride.size(); ++k) out_stride[k] = stride[k] * step[k];
  const int64_t row = last >= 0 ? count[last] : 1;
  const int64_t row_step = last >= 0 ? step[last] : 1;
  return FnKernel::Make(
      spec, absl::StrCat("cpu:slice_", DTypeName(x.dtype)), [=](auto inputs, auto outputs) {
        if (total == 0) return absl::OkStatus();
        const char* in = static_cast<const char*>(HostPtr(inputs[0])) + base * esize;
        char* o = static_cast<char*>(HostPtr(outputs[0]));
        if (out.empty()) {
          std::memcpy(o, in, esize);
          return absl::OkStatus();
        }
        const int64_t rows = Product(out) / row;
        ParallelFor(rows, RowGrain(row * esize), [&](int64_t b, int64_t e) {
          ForRows(out, out_stride, b, e, [&](int64_t rw, int64_t src) {
            StridedCopy(in + src * esize, row_step, row, esize, o + rw * row * esize);
          });
        });
        return absl::OkStatus();
      });
}

// ---- Concat.

KernelOr CreateConcat(const KernelSpec& spec) {
  if (spec.inputs.empty() || spec.outputs.size() != 1)
    return SpecError(spec, "expects inputs and one output");
  const auto& x0 = spec.inputs[0];
  int64_t axis;
  if (x0.rank() == 0 || !NormalizeAxis(spec.attrs.concat().axis(), x0.rank(), &axis)) {
    return SpecError(spec, "concat axis ", spec.attrs.concat().axis(), " out of range for ",
                     TypeString(x0));
  }
  Dims out = x0.dims;
  out[axis] = 0;
  for (const auto& xi : spec.inputs) {
    bool ok = xi.dtype == x0.dtype && xi.rank() == x0.rank();
    for (int64_t k = 0; ok && k < x0.rank(); ++k) ok = k == axis || xi.dims[k] == x0.dims[k];
    if (!ok) return SpecError(spec, "cannot concatenate ", TypeString(x0), " and ", TypeString(xi));
    out[axis] += xi.dims[axis];
  }
  if (auto s = CheckOutput(spec, 0, x0.dtype, out); !s.ok()) return s;
  const int64_t esize = ElementSize(x0.dtype);
  const int64_t outer = Product(out, 0, axis), inner = Product(out, axis + 1, out.size());
  std::vector<int64_t> chunk;  // bytes per outer index, per input
  for (const auto& xi : spec.inputs) chunk.push_back(xi.dims[axis] * inner * esize);
  const int64_t row_bytes = out[axis] * inner * esize;
  return FnKernel::Make(
      spec, absl::StrCat("cpu:concat_", DTypeName(x0.dtype)), [=](auto inputs, auto outputs) {
        if (outer * row_bytes == 0) return absl::OkStatus();
        char* o = static_cast<char*>(HostPtr(outputs[0]));
        if (outer == 1) {
          int64_t at = 0;
          for (size_t i = 0; i < chunk.size(); ++i) {
            if (chunk[i] > 0) ParallelMemcpy(o + at, HostPtr(inputs[i]), chunk[i]);
            at += chunk[i];
          }
          return absl::OkStatus();
        }
        ParallelFor(outer, RowGrain(row_bytes), [&](int64_t b, int64_t e) {
          for (int64_t p = b; p < e; ++p) {
            char* dst = o + p * row_bytes;
            for (size_t i = 0; i < chunk.size(); ++i) {
              if (chunk[i] == 0) continue;
              std::memcpy(dst, static_cast<const char*>(HostPtr(inputs[i])) + p * chunk[i],
                          chunk[i]);
              dst += chunk[i];
            }
          }
        });
        return absl::OkStatus();
      });
}

// ---- Expand (numpy.broadcast_to).

KernelOr CreateExpand(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const Dims target(spec.attrs.expand().shape().begin(), spec.attrs.expand().shape().end());
  const int64_t r = static_cast<int64_t>(target.size());
  if (r < x.rank())
    return SpecError(spec, "cannot expand ", TypeString(x), " to ", DimsToString(target));
  Dims padded(r - x.rank(), 1);
  padded.insert(padded.end(), x.dims.begin(), x.dims.end());
  for (int64_t k = 0; k < r; ++k) {
    if (target[k] < 0 || (padded[k] != 1 && padded[k] != target[k])) {
      return SpecError(spec, "cannot expand ", TypeString(x), " to ", DimsToString(target));
    }
  }
  if (auto s = CheckOutput(spec, 0, x.dtype, target); !s.ok()) return s;
  // Collapse: drop size-1 output axes, merge neighbours both read or both broadcast.
  Dims out;
  std::vector<bool> bcast;
  for (int64_t k = 0; k < r; ++k) {
    if (target[k] == 1) continue;
    const bool b = padded[k] == 1;
    if (!out.empty() && bcast.back() == b) {
      out.back() *= target[k];
      continue;
    }
    out.push_back(target[k]);
    bcast.push_back(b);
  }
  if (out.empty()) out.push_back(1), bcast.push_back(false);
  const int64_t rank = static_cast<int64_t>(out.size());
  std::vector<int64_t> stride(rank, 0);
  for (int64_t k = rank - 1, acc = 1; k >= 0; --k) {
    if (bcast[k]) continue;
    stride[k] = acc;
    acc *= out[k];
  }
  const int64_t esize = ElementSize(x.dtype), row = out.back();
  const bool fill_row = bcast.back();
  return FnKernel::Make(
      spec, absl::StrCat("cpu:expand_", DTypeName(x.dtype)), [=](auto inputs, auto outputs) {
        const int64_t total = Product(out);
        if (total == 0) return absl::OkStatus();
        const char* in = static_cast<const char*>(HostPtr(inputs[0]));
        char* o = static_cast<char*>(HostPtr(outputs[0]));
        ParallelFor(total / row, RowGrain(row * esize), [&](int64_t b, int64_t e) {
          ForRows(out, stride, b, e, [&](int64_t rw, int64_t src) {
            if (fill_row) {
              FillElement(o + rw * row * esize, row, in + src * esize, esize);
            } else {
              std::memcpy(o + rw * row * esize, in + src * esize, row * esize);
            }
          });
        });
        return absl::OkStatus();
      });
}

// ---- Pad (constant / reflect / edge).

KernelOr CreatePad(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& a = spec.attrs.pad();
  const int64_t r = x.rank();
  if (a.low_size() != r || a.high_size() != r)
    return SpecError(spec, "low/high need one entry per dim");
  Dims out = x.dims;
  std::vector<int64_t> lo(a.low().begin(), a.low().end()), hi(a.high().begin(), a.high().end());
  for (int64_t k = 0; k < r; ++k) {
    if (lo[k] < 0 || hi[k] < 0) return SpecError(spec, "negative padding on dim ", k);
    if (a.mode() == v1::PAD_REFLECT && (lo[k] >= x.dims[k] || hi[k] >= x.dims[k]) &&
        lo[k] + hi[k] > 0) {
      return SpecError(spec, "reflect padding on dim ", k, " must be below its size ", x.dims[k]);
    }
    if (a.mode() == v1::PAD_EDGE && x.dims[k] == 0 && lo[k] + hi[k] > 0) {
      return SpecError(spec, "edge padding of an empty dim ", k);
    }
    out[k] += lo[k] + hi[k];
  }
  if (auto s = CheckOutput(spec, 0, x.dtype, out); !s.ok()) return s;
  const int64_t esize = ElementSize(x.dtype);
  // The pad value as one element of the dtype, converted as Cast converts.
  uint64_t reg = 0, value_bits = 0;
  ew::Fill(ew::ClassOf(x.dtype), x.dtype, a.value(), 1, &reg);
  ew::Store(&reg, x.dtype, 1, &value_bits);
  const v1::PadMode mode = a.mode();
  const Dims in_dims = x.dims;
  // Source coordinate of output coordinate c on an axis, or -1 for the pad value.
  auto source = [mode](int64_t c, int64_t n) -> int64_t {
    if (c >= 0 && c < n) return c;
    switch (mode) {
      case v1::PAD_REFLECT:
        return c < 0 ? -c : 2 * (n - 1) - c;
      case v1::PAD_EDGE:
        return c < 0 ? 0 : n - 1;
      default:
        return -1;
    }
  };
  return FnKernel::Make(
      spec, absl::StrCat("cpu:pad_", DTypeName(x.dtype)), [=](auto inputs, auto outputs) {
        const int64_t total = Product(out);
        if (total == 0) return absl::OkStatus();
        const char* in = static_cast<const char*>(HostPtr(inputs[0]));
        char* o = static_cast<char*>(HostPtr(outputs[0]));
        const char* value = reinterpret_cast<const char*>(&value_bits);
        if (r == 0) {
          std::memcpy(o, in, esize);
          return absl::OkStatus();
        }
        const int64_t row = out[r - 1], n = in_dims[r - 1], l = lo[r - 1];
        std::vector<int64_t> in_stride(r, 1);
        for (int64_t k = r - 2; k >= 0; --k) in_stride[k] = in_stride[k + 1] * in_dims[k + 1];
        ParallelFor(total / row, RowGrain(row * esize), [&](int64_t b, int64_t e) {
          for (int64_t rw = b; rw < e; ++rw) {
            char* dst = o + rw * row * esize;
            int64_t rem = rw, src = 0;
            bool pad_row = false;
            for (int64_t k = r - 2; k >= 0 && !pad_row; --k) {
              const int64_t c = source(rem % out[k] - lo[k], in_dims[k]);
              rem /= out[k];
              pad_row = c < 0;
              src += c * in_stride[k];
            }
            if (pad_row || n == 0) {
              FillElement(dst, row, value, esize);
              continue;
            }
            const char* s = in + src * esize;
            std::memcpy(dst + l * esize, s, n * esize);
            for (int64_t j = 0; j < row; ++j) {
              if (j == l) j += n;
              if (j >= row) break;
              const int64_t c = source(j - l, n);
              std::memcpy(dst + j * esize, c < 0 ? value : s + c * esize, esize);
            }
          }
        });
        return absl::OkStatus();
      });
}

// ---- Gather (numpy.take).

template <typename T>
void LoadIndices(const void* p, int64_t n, int64_t* out) {
  const T* src = static_cast<const T*>(p);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<int64_t>(src[i]);  // NOLINT(bugprone-signed-char-misuse)
}

KernelOr CreateGather(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 2, 2, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& idx = spec.inputs[1];
  int64_t axis;
  if (x.rank() == 0 || !NormalizeAxis(spec.attrs.gather().axis(), x.rank(), &axis)) {
    return SpecError(spec, "gather axis ", spec.attrs.gather().axis(), " out of range for ",
                     TypeString(x));
  }
  if (!IsInteger(idx.dtype))
    return SpecError(spec, "indices must be integers, got ", TypeString(idx));
  Dims out(x.dims.begin(), x.dims.begin() + axis);
  out.insert(out.end(), idx.dims.begin(), idx.dims.end());
  out.insert(out.end(), x.dims.begin() + axis + 1, x.dims.end());
  if (auto s = CheckOutput(spec, 0, x.dtype, out); !s.ok()) return s;
  const int64_t pre = Product(x.dims, 0, axis), n = x.dims[axis];
  const int64_t post_bytes = Product(x.dims, axis + 1, x.dims.size()) * ElementSize(x.dtype);
  const int64_t k = idx.num_elements();
  const DType idx_dtype = idx.dtype;
  const std::string label = spec.label;
  const std::string data_type = TypeString(x);
  return FnKernel::Make(
      spec, absl::StrCat("cpu:gather_", DTypeName(x.dtype)),
      [=](auto inputs, auto outputs) -> absl::Status {
        if (pre * k * post_bytes == 0 && k == 0) return absl::OkStatus();
        std::vector<int64_t> rows(k);
        const void* ip = HostPtr(inputs[1]);
        switch (idx_dtype) {
          case v1::DTYPE_I8:
            LoadIndices<int8_t>(ip, k, rows.data());
            break;
          case v1::DTYPE_U8:
            LoadIndices<uint8_t>(ip, k, rows.data());
            break;
          case v1::DTYPE_I16:
            LoadIndices<int16_t>(ip, k, rows.data());
            break;
          case v1::DTYPE_I32:
            LoadIndices<int32_t>(ip, k, rows.data());
            break;
          default:
            LoadIndices<int64_t>(ip, k, rows.data());
            break;
        }
        for (int64_t j = 0; j < k; ++j) {
          const int64_t v = rows[j] < 0 ? rows[j] + n : rows[j];
          if (v < 0 || v >= n) {
            return absl::OutOfRangeError(absl::StrCat(
                label, ": gather index ", rows[j], " (at position ", j, ") is out of range [", -n,
                ", ", n, ") for axis ", axis, " of ", data_type));
          }
          rows[j] = v;
        }
        if (pre * k * post_bytes == 0) return absl::OkStatus();
        const char* in = static_cast<const char*>(HostPtr(inputs[0]));
        char* o = static_cast<char*>(HostPtr(outputs[0]));
        ParallelFor(pre * k, RowGrain(post_bytes), [&](int64_t b, int64_t e) {
          for (int64_t u = b; u < e; ++u) {
            const int64_t p = u / k, j = u % k;
            std::memcpy(o + u * post_bytes, in + (p * n + rows[j]) * post_bytes, post_bytes);
          }
        });
        return absl::OkStatus();
      });
}

Claim SupportsGather(const KernelSpec& spec) {
  if (spec.inputs.size() != 2) return Claim::No("expects data and indices");
  if (!IsInteger(spec.inputs[1].dtype)) {
    return Claim::No(
        absl::StrCat("gather indices must be integers, got ", DTypeName(spec.inputs[1].dtype)));
  }
  return SupportsDense(spec);
}

const CpuOpRegistration kRegistration({
    {v1::OP_RESHAPE, SupportsBytes, CreateReshape},
    {v1::OP_COPY, SupportsBytes, CreateCopy},
    {v1::OP_SLICE, SupportsDense, CreateSlice},
    {v1::OP_CONCAT, SupportsDense, CreateConcat},
    {v1::OP_EXPAND, SupportsDense, CreateExpand},
    {v1::OP_PAD, SupportsDense, CreatePad},
    {v1::OP_GATHER, SupportsGather, CreateGather},
});

}  // namespace
}  // namespace kiln::cpu
