// Transpose: dims are simplified first (size-1 axes dropped, axes that stay
// neighbours merged), then one of two paths runs:
// - the input's last axis stays last ([B,S,H,D] <-> [B,H,S,D]): row copies;
// - otherwise a blocked 2-D transpose of the two innermost axes (32x32 tiles,
//   8x8 AVX2 register transposes for 4-byte elements) under an outer loop;
//   when the output's last axis holds 2 elements and the one before it reads
//   the input's last axis, one interleaving pass per output row.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/transpose.h"

namespace kiln::cpu {
namespace {

struct Layout {
  Dims dims;                  // input dims
  std::vector<int64_t> perm;  // out axis i reads input axis perm[i]
};

Layout Simplify(const Dims& in_dims, std::span<const int64_t> perm) {
  const size_t r = in_dims.size();
  std::vector<int64_t> index(r, -1);
  Dims d;
  for (size_t a = 0; a < r; ++a) {
    if (in_dims[a] == 1) continue;
    index[a] = static_cast<int64_t>(d.size());
    d.push_back(in_dims[a]);
  }
  std::vector<int64_t> p;
  for (size_t i = 0; i < r; ++i) {
    if (index[perm[i]] >= 0) p.push_back(index[perm[i]]);
  }
  // Runs of output axes that read consecutive input axes become one axis.
  struct Group {
    int64_t start, len;
  };
  std::vector<Group> groups;
  for (int64_t a : p) {
    if (!groups.empty() && groups.back().start + groups.back().len == a) {
      ++groups.back().len;
    } else {
      groups.push_back({a, 1});
    }
  }
  std::vector<int64_t> by_input(groups.size());
  std::iota(by_input.begin(), by_input.end(), 0);
  std::sort(by_input.begin(), by_input.end(),
            [&](int64_t a, int64_t b) { return groups[a].start < groups[b].start; });
  Layout out;
  out.perm.resize(groups.size());
  for (size_t k = 0; k < by_input.size(); ++k) {
    const Group& g = groups[by_input[k]];
    out.dims.push_back(Product(d, g.start, g.start + g.len));
    out.perm[by_input[k]] = static_cast<int64_t>(k);
  }
  return out;
}

// 8x8 transpose of 4-byte elements: dst[i][j] = src[j][i].
inline void Transpose8x8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + k * src_stride);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(dst + k * dst_stride, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(dst + (k + 4) * dst_stride, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}

// out[i * os_i + j] = in[j * is_j + i] for i < ni, j < nj.
template <typename T>
void Tile(const T* in, T* out, int64_t ni, int64_t nj, int64_t is_j, int64_t os_i) {
  int64_t i0 = 0;
  if constexpr (sizeof(T) == 4) {
    for (; i0 + 8 <= ni; i0 += 8) {
      int64_t j0 = 0;
      for (; j0 + 8 <= nj; j0 += 8) {
        Transpose8x8(reinterpret_cast<const float*>(in + j0 * is_j + i0), is_j,
                     reinterpret_cast<float*>(out + i0 * os_i + j0), os_i);
      }
      for (int64_t i = i0; i < i0 + 8; ++i) {
        for (int64_t j = j0; j < nj; ++j) out[i * os_i + j] = in[j * is_j + i];
      }
    }
  }
  for (int64_t i = i0; i < ni; ++i) {
    for (int64_t j = 0; j < nj; ++j) out[i * os_i + j] = in[j * is_j + i];
  }
}

// Output rows that interleave two input rows, out[i * 2 + j] = in[j * is_j + i]
// (the output's last axis has 2 elements and the one before it reads the
// input's last axis): how the max pool's derivative interleaves its window
// offsets back. A 32x2 tile per 2x14 elements spent its time on index
// arithmetic, so each output row is one pass here, and rows are stepped, not
// re-derived. 4-byte elements (floats' bits).
void InterleaveTwo(const uint32_t* in, uint32_t* out, const std::vector<int64_t>& od,
                   const std::vector<int64_t>& is, int64_t ni, int64_t is_j) {
  const int64_t outer_axes = static_cast<int64_t>(od.size()) - 2;
  int64_t rows = 1;
  for (int64_t a = 0; a < outer_axes; ++a) rows *= od[a];
  const int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / (2 * ni * 4));
  ParallelFor(rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(outer_axes);
    int64_t rem = begin, src = 0;
    for (int64_t a = outer_axes - 1; a >= 0; --a) {
      idx[a] = rem % od[a];
      rem /= od[a];
      src += idx[a] * is[a];
    }
    for (int64_t row = begin; row < end; ++row) {
      const float* a0 = reinterpret_cast<const float*>(in + src);
      const float* a1 = a0 + is_j;
      float* o = reinterpret_cast<float*>(out + row * 2 * ni);
      int64_t i = 0;
      for (; i + 8 <= ni; i += 8) {
        const __m256 x = _mm256_loadu_ps(a0 + i), y = _mm256_loadu_ps(a1 + i);
        const __m256 lo = _mm256_unpacklo_ps(x, y), hi = _mm256_unpackhi_ps(x, y);
        _mm256_storeu_ps(o + 2 * i, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(o + 2 * i + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
      }
      for (; i < ni; ++i) {
        o[2 * i] = a0[i];
        o[2 * i + 1] = a1[i];
      }
      for (int64_t a = outer_axes - 1; a >= 0; --a) {
        src += is[a];
        if (++idx[a] < od[a]) break;
        src -= od[a] * is[a];
        idx[a] = 0;
      }
    }
  });
}

template <typename T>
void TiledTranspose(const T* in, T* out, const Layout& l) {
  constexpr int64_t kTile = 32;
  const int64_t r = static_cast<int64_t>(l.dims.size());
  std::vector<int64_t> in_stride(r, 1), od(r), is(r), os(r, 1);
  for (int64_t a = r - 2; a >= 0; --a) in_stride[a] = in_stride[a + 1] * l.dims[a + 1];
  for (int64_t i = 0; i < r; ++i) od[i] = l.dims[l.perm[i]], is[i] = in_stride[l.perm[i]];
  for (int64_t i = r - 2; i >= 0; --i) os[i] = os[i + 1] * od[i + 1];
  const int64_t p = std::find(l.perm.begin(), l.perm.end(), r - 1) - l.perm.begin();
  const int64_t ni = od[p], nj = od[r - 1], is_j = is[r - 1], os_i = os[p];
  std::vector<int64_t> outer;  // output axes other than p and the last
  for (int64_t i = 0; i < r - 1; ++i) {
    if (i != p) outer.push_back(i);
  }
  int64_t outer_count = 1;
  for (int64_t a : outer) outer_count *= od[a];
  if constexpr (sizeof(T) == 4) {
    // Enough rows to share out; two long rows keep the tiles' parallelism.
    if (nj == 2 && p == r - 2 && outer_count >= 8) {
      InterleaveTwo(reinterpret_cast<const uint32_t*>(in), reinterpret_cast<uint32_t*>(out), od,
                    is, ni, is_j);
      return;
    }
  }
  const int64_t tiles_i = (ni + kTile - 1) / kTile;
  const int64_t grain =
      std::max<int64_t>(1, kCopyGrainBytes / ((kTile * nj + 1) * static_cast<int64_t>(sizeof(T))));
  ParallelFor(outer_count * tiles_i, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      int64_t o = u / tiles_i, ibase = 0, obase = 0;
      for (size_t k = outer.size(); k-- > 0;) {
        const int64_t c = o % od[outer[k]];
        o /= od[outer[k]];
        ibase += c * is[outer[k]];
        obase += c * os[outer[k]];
      }
      const int64_t i0 = (u % tiles_i) * kTile, ilen = std::min(kTile, ni - i0);
      for (int64_t j0 = 0; j0 < nj; j0 += kTile) {
        Tile(in + ibase + j0 * is_j + i0, out + obase + i0 * os_i + j0, ilen,
             std::min(kTile, nj - j0), is_j, os_i);
      }
    }
  });
}

// The input's last axis stays last: copy rows of `row` elements.
void RowTranspose(const char* in, char* out, const Layout& l, int64_t esize) {
  const int64_t r = static_cast<int64_t>(l.dims.size());
  std::vector<int64_t> in_stride(r, 1);
  for (int64_t a = r - 2; a >= 0; --a) in_stride[a] = in_stride[a + 1] * l.dims[a + 1];
  const int64_t row_bytes = l.dims[r - 1] * esize;
  const int64_t rows = Product(l.dims) / l.dims[r - 1];
  const int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / row_bytes);
  ParallelFor(rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(r - 1);
    int64_t rem = begin, src = 0;
    for (int64_t i = r - 2; i >= 0; --i) {
      idx[i] = rem % l.dims[l.perm[i]];
      rem /= l.dims[l.perm[i]];
      src += idx[i] * in_stride[l.perm[i]];
    }
    for (int64_t row = begin; row < end; ++row) {
      std::memcpy(out + row * row_bytes, in + src * esize, row_bytes);
      for (int64_t i = r - 2; i >= 0; --i) {
        const int64_t a = l.perm[i];
        src += in_stride[a];
        if (++idx[i] < l.dims[a]) break;
        src -= l.dims[a] * in_stride[a];
        idx[i] = 0;
      }
    }
  });
}

}  // namespace

void TransposeBytes(const void* in, void* out, const Dims& in_dims, std::span<const int64_t> perm,
                    int64_t esize) {
  const int64_t n = Product(in_dims);
  if (n == 0) return;
  const Layout l = Simplify(in_dims, perm);
  bool identity = true;
  for (size_t i = 0; i < l.perm.size(); ++i)
    identity = identity && l.perm[i] == static_cast<int64_t>(i);
  if (identity) {
    ParallelMemcpy(out, in, n * esize);
    return;
  }
  const int64_t r = static_cast<int64_t>(l.dims.size());
  if (l.perm[r - 1] == r - 1) {
    RowTranspose(static_cast<const char*>(in), static_cast<char*>(out), l, esize);
    return;
  }
  switch (esize) {
    case 1:
      TiledTranspose(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), l);
      return;
    case 2:
      TiledTranspose(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), l);
      return;
    case 4:
      TiledTranspose(static_cast<const uint32_t*>(in), static_cast<uint32_t*>(out), l);
      return;
    default:
      TiledTranspose(static_cast<const uint64_t*>(in), static_cast<uint64_t*>(out), l);
      return;
  }
}

namespace {

class TransposeKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const backend::KernelSpec& spec) {
    if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
    const auto& x = spec.inputs[0];
    std::vector<int64_t> perm(spec.attrs.transpose().perm().begin(),
                              spec.attrs.transpose().perm().end());
    std::vector<bool> seen(x.rank(), false);
    if (static_cast<int64_t>(perm.size()) != x.rank()) {
      return SpecError(spec, "perm has ", perm.size(), " entries for rank ", x.rank());
    }
    Dims out;
    for (int64_t p : perm) {
      if (p < 0 || p >= x.rank() || seen[p]) return SpecError(spec, "perm is not a permutation");
      seen[p] = true;
      out.push_back(x.dims[p]);
    }
    if (auto s = CheckOutput(spec, 0, x.dtype, out); !s.ok()) return s;
    return std::unique_ptr<backend::Kernel>(new TransposeKernel(spec, std::move(perm)));
  }

  std::string implementation() const override {
    return absl::StrCat("cpu:transpose_", DTypeName(spec_.inputs[0].dtype));
  }

  absl::Status Run(std::span<const backend::BufferView> inputs,
                   std::span<const backend::BufferView> outputs) override {
    if (auto s = CheckViews(spec_, inputs, outputs); !s.ok()) return s;
    if (spec_.inputs[0].num_elements() == 0) return absl::OkStatus();
    TransposeBytes(inputs[0].host(), outputs[0].host(), spec_.inputs[0].dims, perm_,
                   ElementSize(spec_.inputs[0].dtype));
    return absl::OkStatus();
  }

 private:
  TransposeKernel(const backend::KernelSpec& spec, std::vector<int64_t> perm)
      : spec_(spec), perm_(std::move(perm)) {}
  backend::KernelSpec spec_;
  std::vector<int64_t> perm_;
};

backend::Claim Supports(const backend::KernelSpec& spec) {
  if (spec.inputs.size() != 1 || !IsDense(spec.inputs[0].dtype)) {
    return backend::Claim::No(
        "cpu transposes one dense tensor (block-quantized data cannot be permuted)");
  }
  return backend::Claim::Yes();
}

const CpuOpRegistration kRegistration({{v1::OP_TRANSPOSE, Supports, TransposeKernel::Create}});

}  // namespace
}  // namespace kiln::cpu
