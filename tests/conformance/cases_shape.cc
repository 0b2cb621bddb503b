// Conformance cases for the shape ops: reshape, copy, transpose, slice,
// concat, expand, pad, gather (with its out-of-range error). Data movement is
// exact, so every budget is zero. References map each output multi-index to
// its source with plain index arithmetic.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using ref::Ravel;
using ref::Shape;
using ref::Unravel;

// Exercise one element size of each kind (1, 2, 4, 8 bytes) plus bool.
const std::vector<DType>& MoveTypes() {
  static const std::vector<DType> t = {v1::DTYPE_F32, v1::DTYPE_F16,  v1::DTYPE_I8,
                                       v1::DTYPE_F64, v1::DTYPE_BOOL, v1::DTYPE_I32};
  return t;
}

HostTensor Data(std::mt19937_64& rng, DType dt, const Dims& dims) {
  return RandomTensor(rng, dt, dims, -100, 100);
}

// The value an output element takes: an index into input `which`, or a
// constant when source < 0.
struct Source {
  int which = 0;
  int64_t index = -1;
  double constant = 0;
};
using SourceFn = std::function<Source(const std::vector<int64_t>& out_idx)>;

Case MoveCase(const std::string& name, v1::OpKind op, const v1::Attrs& attrs,
              std::vector<HostTensor> inputs, const Dims& out, SourceFn source) {
  std::vector<backend::TensorDesc> ins;
  for (const HostTensor& t : inputs) ins.push_back(Desc(t.dtype(), t.dims()));
  const DType dt = inputs[0].dtype();
  Case c;
  c.name = name;
  c.spec = ref::Spec(name, op, attrs, std::move(ins), {Desc(dt, out)});
  c.inputs = std::move(inputs);
  c.reference = [out, source](const backend::KernelSpec&, const std::vector<HostTensor>& in) {
    std::vector<HostTensor> result;
    result.push_back(F64(out));
    for (int64_t e = 0; e < result[0].num_elements(); ++e) {
      const Source s = source(Unravel(e, out));
      result[0].SetFromDouble(e, s.index < 0 ? s.constant : At(in[s.which], s.index));
    }
    return result;
  };
  c.tol = {0, 0};
  return c;
}

std::vector<Case> ReshapeCopyCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<Dims, std::vector<int64_t>>> shapes = {
      {{2, 3, 4}, {6, -1}}, {{24}, {2, 3, 4}}, {{}, {1, 1}},
      {{0, 3}, {3, 0}},     {{5, 1, 7}, {-1}}, {{1000}, {8, 125}}};
  for (DType dt : MoveTypes()) {
    for (const auto& [in, target] : shapes) {
      const std::string name = absl::StrCat("reshape/", DTypeName(dt), "_", Shape(in), "_to_",
                                            absl::StrJoin(target, "x"));
      auto rng = RngFor(name);
      Dims out(target.begin(), target.end());
      int64_t known = 1;
      for (int64_t d : out) known *= d == -1 ? 1 : d;
      for (auto& d : out) {
        if (d == -1) d = ref::NumElements(in) / std::max<int64_t>(known, 1);
      }
      v1::Attrs a;
      for (int64_t d : target) a.mutable_reshape()->add_shape(d);
      cases.push_back(MoveCase(name, v1::OP_RESHAPE, a, ref::Tensors{Data(rng, dt, in)}, out,
                               [out](const std::vector<int64_t>& i) {
                                 return Source{0, Ravel(i, out)};
                               }));
      const Dims in_copy = in;
      cases.push_back(MoveCase(absl::StrCat("copy/", DTypeName(dt), "_", Shape(in)), v1::OP_COPY,
                               v1::Attrs(), ref::Tensors{Data(rng, dt, in)}, in,
                               [in_copy](const std::vector<int64_t>& i) {
                                 return Source{0, Ravel(i, in_copy)};
                               }));
    }
  }
  return cases;
}

std::vector<Case> TransposeCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<Dims, std::vector<int64_t>>> perms = {
      {{67, 45}, {1, 0}},
      {{2, 33, 5, 17}, {0, 2, 1, 3}},
      {{2, 33, 5, 17}, {0, 2, 3, 1}},
      {{2, 33, 5, 17}, {3, 2, 1, 0}},
      {{1, 1, 5}, {2, 0, 1}},
      {{0, 4, 3}, {2, 1, 0}},
      {{}, {}},
      {{7}, {0}},
      {{3, 1, 4, 1}, {3, 2, 1, 0}},
      {{9, 8, 7}, {1, 2, 0}},
      {{4, 6, 8, 10}, {0, 1, 3, 2}},
      {{16, 16}, {1, 0}},
      {{2, 3, 4, 5, 6}, {4, 0, 3, 1, 2}},
      {{33, 31}, {1, 0}},
      // Interleaves of two rows (the max pool derivative's window offsets):
      // rows of 8+ (vector) and of fewer elements, outer axes merged or not.
      {{2, 2, 3, 4, 14}, {2, 3, 0, 4, 1}},
      {{2, 2, 5, 7}, {2, 0, 3, 1}},
      {{9, 2, 9}, {0, 2, 1}},
  };
  for (DType dt : MoveTypes()) {
    for (const auto& [in, perm] : perms) {
      const std::string name =
          absl::StrCat("transpose/", DTypeName(dt), "_", Shape(in), "_p", absl::StrJoin(perm, ""));
      auto rng = RngFor(name);
      Dims out;
      for (int64_t p : perm) out.push_back(in[p]);
      v1::Attrs a;
      for (int64_t p : perm) a.mutable_transpose()->add_perm(p);
      cases.push_back(MoveCase(name, v1::OP_TRANSPOSE, a, ref::Tensors{Data(rng, dt, in)}, out,
                               [in = in, perm = perm](const std::vector<int64_t>& o) {
                                 std::vector<int64_t> i(o.size());
                                 for (size_t k = 0; k < o.size(); ++k) i[perm[k]] = o[k];
                                 return Source{0, Ravel(i, in)};
                               }));
    }
  }
  // Encoder layouts, large enough to run in parallel: [B,S,H,D] <-> [B,H,S,D],
  // k^T, and a plain 2-D transpose.
  const std::vector<std::pair<Dims, std::vector<int64_t>>> big = {
      {{2, 128, 12, 64}, {0, 2, 1, 3}}, {{2, 12, 128, 64}, {0, 1, 3, 2}}, {{768, 513}, {1, 0}},
      // The Fashion CNN's max-pool derivative interleave, 8 images.
      {{2, 2, 8, 16, 14, 14}, {2, 3, 4, 0, 5, 1}}};
  for (const auto& [in, perm] : big) {
    const std::string name =
        absl::StrCat("transpose/large_", Shape(in), "_p", absl::StrJoin(perm, ""));
    auto rng = RngFor(name);
    Dims out;
    v1::Attrs a;
    for (int64_t p : perm) out.push_back(in[p]), a.mutable_transpose()->add_perm(p);
    cases.push_back(MoveCase(name, v1::OP_TRANSPOSE, a, ref::Tensors{Data(rng, v1::DTYPE_F32, in)},
                             out, [in = in, perm = perm](const std::vector<int64_t>& o) {
                               std::vector<int64_t> i(o.size());
                               for (size_t k = 0; k < o.size(); ++k) i[perm[k]] = o[k];
                               return Source{0, Ravel(i, in)};
                             }));
  }
  return cases;
}

struct SliceSpec {
  Dims in;
  std::vector<int64_t> start, stop, step, axes;
};

std::vector<Case> SliceCases() {
  std::vector<Case> cases;
  const std::vector<SliceSpec> specs = {
      {{10, 7}, {2, 0}, {8, 7}, {}, {}},
      {{10, 7}, {-3, 1}, {100, -1}, {2, 3}, {}},
      {{4, 5, 6}, {1}, {3}, {}, {1}},
      {{4, 5, 6}, {-100, 5}, {100, 1}, {1, 1}, {0, 2}},
      {{9}, {7}, {2}, {}, {}},
      {{3, 300}, {0, 5}, {3, 290}, {2, 3}, {}},
      {{2, 3, 4, 5}, {0, 0, 1, 0}, {2, 3, 3, 5}, {}, {}},
      {{6, 1, 8}, {1}, {6}, {2}, {-3}},
      {{0, 4}, {0}, {2}, {}, {1}},
      {{5, 9}, {4}, {5}, {}, {0}},
  };
  for (DType dt : MoveTypes()) {
    for (size_t k = 0; k < specs.size(); ++k) {
      const SliceSpec& s = specs[k];
      const std::string name = absl::StrCat("slice/", DTypeName(dt), "_", k);
      auto rng = RngFor(name);
      const int64_t r = static_cast<int64_t>(s.in.size());
      std::vector<int64_t> b(r, 0), st(r, 1);
      Dims out = s.in;
      for (size_t i = 0; i < s.start.size(); ++i) {
        int64_t axis = s.axes.empty() ? static_cast<int64_t>(i) : s.axes[i];
        if (axis < 0) axis += r;
        const int64_t dim = s.in[axis];
        auto fix = [dim](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + dim : v, 0, dim); };
        b[axis] = fix(s.start[i]);
        st[axis] = s.step.empty() ? 1 : s.step[i];
        const int64_t e = fix(s.stop[i]);
        out[axis] = e > b[axis] ? (e - b[axis] + st[axis] - 1) / st[axis] : 0;
      }
      v1::Attrs a;
      auto* sa = a.mutable_slice();
      for (int64_t v : s.start) sa->add_start(v);
      for (int64_t v : s.stop) sa->add_stop(v);
      for (int64_t v : s.step) sa->add_step(v);
      for (int64_t v : s.axes) sa->add_axes(v);
      const Dims in = s.in;
      cases.push_back(MoveCase(name, v1::OP_SLICE, a, ref::Tensors{Data(rng, dt, in)}, out,
                               [in, b, st](const std::vector<int64_t>& o) {
                                 std::vector<int64_t> i(o.size());
                                 for (size_t k = 0; k < o.size(); ++k) i[k] = b[k] + o[k] * st[k];
                                 return Source{0, Ravel(i, in)};
                               }));
    }
  }
  return cases;
}

std::vector<Case> ConcatCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<std::vector<Dims>, int64_t>> specs = {
      {{{2, 3}, {4, 3}}, 0}, {{{2, 3}, {2, 5}, {2, 1}}, 1}, {{{2, 3, 4}, {2, 0, 4}, {2, 7, 4}}, 1},
      {{{3, 5}}, -1},        {{{1, 300}, {1, 200}}, -1},    {{{4, 2, 3}, {4, 2, 5}}, 2},
      {{{0, 2}, {3, 2}}, 0}, {{{64, 64}, {64, 64}}, 0},
  };
  for (DType dt : MoveTypes()) {
    for (size_t k = 0; k < specs.size(); ++k) {
      const auto& [shapes, axis_attr] = specs[k];
      const std::string name = absl::StrCat("concat/", DTypeName(dt), "_", k);
      auto rng = RngFor(name);
      const int64_t axis =
          axis_attr < 0 ? axis_attr + static_cast<int64_t>(shapes[0].size()) : axis_attr;
      std::vector<HostTensor> inputs;
      Dims out = shapes[0];
      out[axis] = 0;
      std::vector<int64_t> offsets;
      for (const Dims& d : shapes) {
        offsets.push_back(out[axis]);
        out[axis] += d[axis];
        inputs.push_back(Data(rng, dt, d));
      }
      v1::Attrs a;
      a.mutable_concat()->set_axis(axis_attr);
      cases.push_back(MoveCase(name, v1::OP_CONCAT, a, std::move(inputs), out,
                               [shapes = shapes, offsets, axis](const std::vector<int64_t>& o) {
                                 int which = static_cast<int>(offsets.size()) - 1;
                                 while (offsets[which] > o[axis] || shapes[which][axis] == 0)
                                   --which;
                                 std::vector<int64_t> i = o;
                                 i[axis] -= offsets[which];
                                 return Source{which, Ravel(i, shapes[which])};
                               }));
    }
  }
  return cases;
}

std::vector<Case> ExpandCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<Dims, Dims>> specs = {
      {{3}, {4, 3}},
      {{4, 1}, {4, 300}},
      {{}, {2, 3}},
      {{1, 5, 1}, {2, 5, 7}},
      {{2, 1, 3}, {4, 2, 6, 3}},
      {{1}, {0, 1}},
      {{5}, {5}},
      {{1, 1}, {1, 1}},
      {{768}, {64, 768}},
  };
  for (DType dt : MoveTypes()) {
    for (const auto& [in, out] : specs) {
      const std::string name =
          absl::StrCat("expand/", DTypeName(dt), "_", Shape(in), "_to_", Shape(out));
      auto rng = RngFor(name);
      v1::Attrs a;
      for (int64_t d : out) a.mutable_expand()->add_shape(d);
      cases.push_back(MoveCase(name, v1::OP_EXPAND, a, ref::Tensors{Data(rng, dt, in)}, out,
                               [in = in, out = out](const std::vector<int64_t>& o) {
                                 return Source{0, ref::BroadcastIndex(out, in, Ravel(o, out))};
                               }));
    }
  }
  return cases;
}

std::vector<Case> PadCases() {
  std::vector<Case> cases;
  struct PadSpec {
    Dims in;
    std::vector<int64_t> lo, hi;
  };
  const std::vector<PadSpec> specs = {
      {{5}, {2}, {3}},
      {{3, 4}, {1, 0}, {2, 3}},
      {{2, 3, 4}, {0, 2, 1}, {1, 0, 3}},
      {{4, 300}, {1, 2}, {0, 1}},
      {{}, {}, {}},
      {{6, 1}, {0, 0}, {0, 0}},
      {{3, 5}, {2, 4}, {2, 4}},
  };
  for (int mode = v1::PAD_CONSTANT; mode <= v1::PAD_EDGE; ++mode) {
    for (DType dt : MoveTypes()) {
      for (size_t k = 0; k < specs.size(); ++k) {
        const PadSpec& s = specs[k];
        bool ok = true;  // reflect needs pads below the dim
        for (size_t d = 0; d < s.in.size(); ++d) {
          ok = ok && (mode != v1::PAD_REFLECT || (s.lo[d] < s.in[d] && s.hi[d] < s.in[d]));
        }
        if (!ok) continue;
        const std::string name = absl::StrCat("pad/", mode, "_", DTypeName(dt), "_", k);
        auto rng = RngFor(name);
        Dims out = s.in;
        for (size_t d = 0; d < out.size(); ++d) out[d] += s.lo[d] + s.hi[d];
        v1::Attrs a;
        for (int64_t v : s.lo) a.mutable_pad()->add_low(v);
        for (int64_t v : s.hi) a.mutable_pad()->add_high(v);
        a.mutable_pad()->set_mode(static_cast<v1::PadMode>(mode));
        a.mutable_pad()->set_value(-2.75);
        const double value = ref::CastValue(-2.75, v1::DTYPE_F64, dt);
        const Dims in = s.in;
        const std::vector<int64_t> lo = s.lo;
        cases.push_back(MoveCase(name, v1::OP_PAD, a, ref::Tensors{Data(rng, dt, in)}, out,
                                 [in, lo, mode, value](const std::vector<int64_t>& o) {
                                   std::vector<int64_t> i(o.size());
                                   for (size_t d = 0; d < o.size(); ++d) {
                                     int64_t c = o[d] - lo[d];
                                     const int64_t n = in[d];
                                     if (c < 0 || c >= n) {
                                       if (mode == v1::PAD_CONSTANT) return Source{0, -1, value};
                                       if (mode == v1::PAD_EDGE) c = c < 0 ? 0 : n - 1;
                                       if (mode == v1::PAD_REFLECT)
                                         c = c < 0 ? -c : 2 * (n - 1) - c;
                                     }
                                     i[d] = c;
                                   }
                                   return Source{0, Ravel(i, in)};
                                 }));
      }
    }
  }
  return cases;
}

std::vector<Case> GatherCases() {
  std::vector<Case> cases;
  struct GatherSpec {
    Dims data, idx;
    int64_t axis;
  };
  const std::vector<GatherSpec> specs = {
      {{10, 4}, {6}, 0}, {{3, 9, 2}, {2, 5}, 1}, {{4, 7}, {}, -1}, {{30522 / 30, 768}, {128}, 0},
      {{5}, {0}, 0},     {{2, 3, 4}, {3, 1}, 2}, {{6, 1}, {4}, 0},
  };
  const DType idx_types[] = {v1::DTYPE_I64, v1::DTYPE_I32, v1::DTYPE_I16, v1::DTYPE_I8,
                             v1::DTYPE_U8};
  int t = 0;
  for (DType dt : MoveTypes()) {
    for (size_t k = 0; k < specs.size(); ++k, ++t) {
      const GatherSpec& s = specs[k];
      const DType it = idx_types[t % 5];
      const std::string name = absl::StrCat("gather/", DTypeName(dt), "_", k, "_", DTypeName(it));
      auto rng = RngFor(name);
      const int64_t axis = s.axis < 0 ? s.axis + static_cast<int64_t>(s.data.size()) : s.axis;
      const int64_t n = s.data[axis];
      // Negative indices count from the end (unsigned indices cannot).
      HostTensor idx = RandomTensor(rng, it, s.idx, it == v1::DTYPE_U8 ? 0 : -n, n - 1);
      Dims out(s.data.begin(), s.data.begin() + axis);
      out.insert(out.end(), s.idx.begin(), s.idx.end());
      out.insert(out.end(), s.data.begin() + axis + 1, s.data.end());
      v1::Attrs a;
      a.mutable_gather()->set_axis(s.axis);
      const Dims data = s.data, idims = s.idx;
      std::vector<int64_t> rows;
      for (int64_t j = 0; j < idx.num_elements(); ++j) {
        const int64_t v = static_cast<int64_t>(At(idx, j));
        rows.push_back(v < 0 ? v + n : v);
      }
      const int64_t ir = static_cast<int64_t>(idims.size());
      cases.push_back(
          MoveCase(name, v1::OP_GATHER, a, ref::Tensors{Data(rng, dt, data), std::move(idx)}, out,
                   [data, idims, rows, axis, ir](const std::vector<int64_t>& o) {
                     std::vector<int64_t> i(o.begin(), o.begin() + axis);
                     const std::vector<int64_t> j(o.begin() + axis, o.begin() + axis + ir);
                     i.push_back(rows[Ravel(j, idims)]);
                     i.insert(i.end(), o.begin() + axis + ir, o.end());
                     return Source{0, Ravel(i, data)};
                   }));
    }
  }
  // Out-of-range indices fail the launch naming the node, index and range.
  for (int bad : {5, -6, 100}) {
    const std::string name = absl::StrCat("gather/out_of_range_", bad);
    auto rng = RngFor(name);
    v1::Attrs a;
    a.mutable_gather()->set_axis(0);
    Case c =
        MoveCase(name, v1::OP_GATHER, a,
                 ref::Tensors{Data(rng, v1::DTYPE_F32, {5, 3}),
                              ref::Values(v1::DTYPE_I64, {4}, {0, 4, static_cast<double>(bad), 1})},
                 {4, 3}, [](const std::vector<int64_t>&) { return Source{}; });
    c.expect_error = absl::StrCat(c.spec.label, ": gather index ", bad,
                                  " (at position 2) is out of range [-5, 5)");
    cases.push_back(std::move(c));
  }
  return cases;
}

const FamilyRegistration kReshape("reshape_copy", ReshapeCopyCases);
const FamilyRegistration kTranspose("transpose", TransposeCases);
const FamilyRegistration kSlice("slice", SliceCases);
const FamilyRegistration kConcat("concat", ConcatCases);
const FamilyRegistration kExpand("expand", ExpandCases);
const FamilyRegistration kPad("pad", PadCases);
const FamilyRegistration kGather("gather", GatherCases);

}  // namespace
}  // namespace kiln::conformance
