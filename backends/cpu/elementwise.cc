#include "backends/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"

namespace kiln::cpu::ew {
namespace {

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(what); }

std::string Lower(const std::string& enum_name, size_t prefix) {
  return absl::AsciiStrToLower(enum_name.substr(std::min(prefix, enum_name.size())));
}

std::string InstrName(const Instr& in) {
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

// Decodes and checks instruction `index` against the dtypes of the values
// before it (`values`: the program's inputs, then earlier instructions).
absl::StatusOr<Instr> Decode(const v1::FusedInstr& f, int index, const std::vector<DType>& values) {
  Instr in;
  in.op = f.op();
  in.dtype = f.dtype();
  in.num_args = f.args_size();
  const std::string where = absl::StrCat("instruction ", index, " (", v1::OpKind_Name(f.op()), ")");
  auto arity = [&](int n) -> absl::Status {
    if (f.args_size() != n)
      return Bad(absl::StrCat(where, " takes ", n, " operands, got ", f.args_size()));
    return absl::OkStatus();
  };
  for (int k = 0; k < f.args_size() && k < 3; ++k) {
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
  for (int k = 0; k < in.num_args && k < 3; ++k) {
    if (!IsDense(arg(k))) {
      return Bad(absl::StrCat(where, " reads ", DTypeName(arg(k)),
                              "; block-quantized types are read only by dequantize"));
    }
  }
  if (in.num_args > 0) in.arg_dtype = arg(0);
  switch (f.op()) {
    case v1::OP_UNARY: {
      if (auto s = arity(1); !s.ok()) return s;
      in.kind = f.unary().kind();
      if (!UnarySupported(in.kind, arg(0))) {
        return Bad(absl::StrCat("cpu implements unary ",
                                v1::UnaryKind_Name(static_cast<v1::UnaryKind>(in.kind)), " on ",
                                "floats (and identity/relu/neg/abs/sign on signed integers), not ",
                                DTypeName(arg(0))));
      }
      if (auto s = result_is(arg(0)); !s.ok()) return s;
      break;
    }
    case v1::OP_BINARY: {
      if (auto s = arity(2); !s.ok()) return s;
      if (auto s = same(0, 1); !s.ok()) return s;
      in.kind = f.binary().kind();
      if (!BinarySupported(in.kind, arg(0))) {
        return Bad(absl::StrCat(
            "cpu implements binary ", v1::BinaryKind_Name(static_cast<v1::BinaryKind>(in.kind)),
            " on floats (and every kind but pow on integers), not ", DTypeName(arg(0))));
      }
      if (auto s = result_is(arg(0)); !s.ok()) return s;
      break;
    }
    case v1::OP_COMPARE: {
      if (auto s = arity(2); !s.ok()) return s;
      if (auto s = same(0, 1); !s.ok()) return s;
      in.kind = f.compare().kind();
      if (in.kind <= v1::COMPARE_KIND_UNSPECIFIED || in.kind > v1::COMPARE_GE) {
        return Bad(absl::StrCat(where, " has unknown compare kind ", in.kind));
      }
      if (auto s = result_is(v1::DTYPE_BOOL); !s.ok()) return s;
      break;
    }
    case v1::OP_WHERE: {
      if (auto s = arity(3); !s.ok()) return s;
      if (arg(0) != v1::DTYPE_BOOL) return Bad(absl::StrCat(where, " needs a bool condition"));
      if (auto s = same(1, 2); !s.ok()) return s;
      if (auto s = result_is(arg(1)); !s.ok()) return s;
      break;
    }
    case v1::OP_CAST: {
      if (auto s = arity(1); !s.ok()) return s;
      const DType to = f.cast().to() == v1::DTYPE_UNSPECIFIED ? in.dtype : f.cast().to();
      if (!IsDense(to))
        return Bad(absl::StrCat(where, " casts to ", DTypeName(to), ", not a dense type"));
      if (auto s = result_is(to); !s.ok()) return s;
      break;
    }
    case v1::OP_CLAMP: {
      if (auto s = arity(1); !s.ok()) return s;
      if (!IsFloat(arg(0)) && !IsInteger(arg(0))) {
        return Bad(absl::StrCat("cpu implements clamp on numbers, not ", DTypeName(arg(0))));
      }
      const auto& c = f.clamp();
      in.has_lo = c.has_min();
      in.has_hi = c.has_max();
      in.lo = c.min();
      in.hi = c.max();
      if ((in.has_lo && std::isnan(in.lo)) || (in.has_hi && std::isnan(in.hi)) ||
          (in.has_lo && in.has_hi && in.lo > in.hi)) {
        return Bad(absl::StrCat(where, " has bounds [", in.lo, ", ", in.hi, "]"));
      }
      if (auto s = result_is(arg(0)); !s.ok()) return s;
      break;
    }
    case v1::OP_CONSTANT:
      if (auto s = arity(0); !s.ok()) return s;
      if (!IsDense(in.dtype)) return Bad(absl::StrCat(where, " has dtype ", DTypeName(in.dtype)));
      in.scalar = f.scalar();
      break;
    default:
      return Bad(absl::StrCat(where, ": cpu runs unary, binary, compare, where, cast, clamp and ",
                              "scalar constants in an elementwise region"));
  }
  return in;
}

// The one instruction a standalone elementwise spec stands for.
absl::StatusOr<v1::FusedInstr> SingleInstr(const backend::KernelSpec& spec, int arity) {
  if (spec.inputs.size() != static_cast<size_t>(arity) || spec.outputs.size() != 1) {
    return Bad(absl::StrCat("expects ", arity, " inputs and 1 output, got ", spec.inputs.size(),
                            " and ", spec.outputs.size()));
  }
  v1::FusedInstr f;
  f.set_op(spec.op);
  for (int i = 0; i < arity; ++i) f.add_args(i);
  f.set_dtype(spec.outputs[0].dtype);
  switch (spec.op) {
    case v1::OP_UNARY:
      *f.mutable_unary() = spec.attrs.unary();
      break;
    case v1::OP_BINARY:
      *f.mutable_binary() = spec.attrs.binary();
      break;
    case v1::OP_COMPARE:
      *f.mutable_compare() = spec.attrs.compare();
      break;
    case v1::OP_CAST:
      *f.mutable_cast() = spec.attrs.cast();
      break;
    case v1::OP_CLAMP:
      *f.mutable_clamp() = spec.attrs.clamp();
      break;
    default:
      break;
  }
  return f;
}

void Exec(const Instr& in, const void* const* regs, void* dst, int64_t n) {
  const RegClass cls = ClassOf(in.dtype);
  auto a = [&](int k) { return regs[in.args[k]]; };
  switch (in.op) {
    case v1::OP_UNARY:
      Unary(cls, in.kind, a(0), dst, n);
      RoundToDType(dst, in.dtype, n);
      return;
    case v1::OP_BINARY:
      Binary(cls, in.kind, a(0), a(1), dst, n);
      RoundToDType(dst, in.dtype, n);
      return;
    case v1::OP_COMPARE:
      Compare(ClassOf(in.arg_dtype), in.kind, a(0), a(1), dst, n);
      return;
    case v1::OP_WHERE:
      Where(cls, a(0), a(1), a(2), dst, n);
      return;
    case v1::OP_CAST:
      Cast(in.arg_dtype, in.dtype, a(0), dst, n);
      return;
    case v1::OP_CLAMP:
      Clamp(cls, in.dtype, in.has_lo, in.lo, in.has_hi, in.hi, a(0), dst, n);
      return;
    case v1::OP_CONSTANT:
      Fill(cls, in.dtype, in.scalar, n, dst);
      return;
    default:
      return;
  }
}

// Relative cost of an instruction per element, for parallel grain sizes.
int Weight(const Instr& in) {
  if (in.op == v1::OP_BINARY && in.kind == v1::BINARY_POW) return 20;
  if (in.op != v1::OP_UNARY) return 1;
  switch (in.kind) {
    case v1::UNARY_IDENTITY:
    case v1::UNARY_RELU:
    case v1::UNARY_NEG:
    case v1::UNARY_ABS:
    case v1::UNARY_FLOOR:
    case v1::UNARY_CEIL:
    case v1::UNARY_ROUND:
    case v1::UNARY_SIGN:
      return 1;
    case v1::UNARY_SIN:
    case v1::UNARY_COS:
      return 20;
    default:
      return 8;
  }
}

bool NativeStorage(DType d) {
  return d == v1::DTYPE_F32 || d == v1::DTYPE_F64 || d == v1::DTYPE_I64;
}

}  // namespace

absl::StatusOr<Program> ProgramFromSpec(const backend::KernelSpec& spec) {
  Program p;
  std::vector<v1::FusedInstr> instrs;
  std::vector<int> results;
  switch (spec.op) {
    case v1::OP_UNARY:
    case v1::OP_CAST:
    case v1::OP_CLAMP:
    case v1::OP_BINARY:
    case v1::OP_COMPARE:
    case v1::OP_WHERE: {
      int arity = 1;
      if (spec.op == v1::OP_BINARY || spec.op == v1::OP_COMPARE) arity = 2;
      if (spec.op == v1::OP_WHERE) arity = 3;
      auto f = SingleInstr(spec, arity);
      if (!f.ok()) return f.status();
      instrs.push_back(*std::move(f));
      results.push_back(0);
      break;
    }
    case v1::OP_FUSED_ELEMENTWISE: {
      const auto& a = spec.attrs.fused_elementwise();
      if (spec.inputs.empty()) return Bad("a fused region needs at least one input");
      instrs.assign(a.instrs().begin(), a.instrs().end());
      results.assign(a.results().begin(), a.results().end());
      if (results.size() != spec.outputs.size()) {
        return Bad(absl::StrCat("region has ", results.size(), " results but the spec ",
                                spec.outputs.size(), " outputs"));
      }
      break;
    }
    default:
      return Bad(absl::StrCat(v1::OpKind_Name(spec.op), " is not an elementwise op"));
  }
  std::vector<DType> values;
  for (const auto& d : spec.inputs) {
    if (!IsDense(d.dtype)) {
      return Bad(
          absl::StrCat("cpu elementwise kernels read dense types, not ", DTypeName(d.dtype)));
    }
    values.push_back(d.dtype);
    p.inputs.push_back(d.dtype);
  }
  for (size_t j = 0; j < instrs.size(); ++j) {
    auto in = Decode(instrs[j], static_cast<int>(j), values);
    if (!in.ok()) return in.status();
    values.push_back(in->dtype);
    p.instrs.push_back(*in);
  }
  for (size_t k = 0; k < results.size(); ++k) {
    const int r = results[k];
    if (r < 0 || r >= static_cast<int>(p.instrs.size())) {
      return Bad(absl::StrCat("region result ", r, " is not an instruction"));
    }
    if (p.instrs[r].dtype != spec.outputs[k].dtype) {
      return Bad(absl::StrCat("output ", k, " is ", DTypeName(spec.outputs[k].dtype),
                              " but its instruction computes ", DTypeName(p.instrs[r].dtype)));
    }
    p.results.push_back(r);
  }
  if (p.results.empty()) return Bad("a fused region needs at least one result");
  return p;
}

std::string ProgramName(const Program& program) {
  if (program.instrs.size() == 1) {
    return absl::StrCat(InstrName(program.instrs[0]), "_", DTypeName(program.instrs[0].dtype));
  }
  return absl::StrCat("fused_elementwise_", program.instrs.size());
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(Program program,
                                                           const std::vector<Dims>& input_dims,
                                                           const Dims& out_dims,
                                                           std::vector<DType> out_dtypes) {
  const size_t nin = program.inputs.size();
  if (input_dims.size() != nin || out_dtypes.size() != program.results.size()) {
    return Bad("executor: inputs or outputs do not match the program");
  }
  for (size_t k = 0; k < out_dtypes.size(); ++k) {
    if (ClassOf(out_dtypes[k]) != ClassOf(program.instrs[program.results[k]].dtype)) {
      return Bad(absl::StrCat("output ", k, " dtype ", DTypeName(out_dtypes[k]),
                              " cannot hold its result"));
    }
  }
  auto ex = std::unique_ptr<Executor>(new Executor());
  const size_t rank = out_dims.size();
  ex->total_ = Product(out_dims);
  // Right-align every input against the output and check the broadcast.
  std::vector<Dims> padded(nin);
  for (size_t i = 0; i < nin; ++i) {
    if (input_dims[i].size() > rank) {
      return Bad(absl::StrCat("input ", i, " ", DimsToString(input_dims[i]),
                              " has a higher rank than the output ", DimsToString(out_dims)));
    }
    padded[i].assign(rank - input_dims[i].size(), 1);
    padded[i].insert(padded[i].end(), input_dims[i].begin(), input_dims[i].end());
    for (size_t d = 0; d < rank; ++d) {
      if (padded[i][d] != out_dims[d] && padded[i][d] != 1) {
        return Bad(absl::StrCat("input ", i, " ", DimsToString(input_dims[i]),
                                " does not broadcast to ", DimsToString(out_dims)));
      }
    }
  }
  // Collapse: drop size-1 output dims, merge neighbours that every input
  // either broadcasts in both or reads in both.
  std::vector<std::vector<bool>> bcast(nin);
  for (size_t d = 0; d < rank; ++d) {
    if (out_dims[d] == 1) continue;
    bool merge = !ex->dims_.empty();
    for (size_t i = 0; i < nin && merge; ++i) {
      merge = bcast[i].back() == (padded[i][d] == 1);
    }
    if (merge) {
      ex->dims_.back() *= out_dims[d];
      continue;
    }
    ex->dims_.push_back(out_dims[d]);
    for (size_t i = 0; i < nin; ++i) bcast[i].push_back(padded[i][d] == 1);
  }
  if (ex->dims_.empty()) {
    ex->dims_.push_back(1);
    for (size_t i = 0; i < nin; ++i) bcast[i].push_back(false);
  }
  // Input fetch plans.
  std::vector<int> last_use(nin + program.instrs.size(), -1);
  for (size_t j = 0; j < program.instrs.size(); ++j) {
    for (int k = 0; k < program.instrs[j].num_args; ++k) last_use[program.instrs[j].args[k]] = j;
  }
  const int never = static_cast<int>(program.instrs.size());
  for (int r : program.results) last_use[nin + r] = never;
  ex->inputs_.resize(nin);
  for (size_t i = 0; i < nin; ++i) {
    InputPlan& in = ex->inputs_[i];
    in.dtype = program.inputs[i];
    in.native = NativeStorage(in.dtype);
    if (last_use[i] < 0 || ex->total_ == 0) continue;
    const int64_t n = Product(input_dims[i]);
    if (n == ex->total_) {
      in.fetch = Fetch::kContiguous;
    } else if (n == 1) {
      in.fetch = Fetch::kScalar;
    } else {
      in.fetch = Fetch::kStrided;
      in.stride.assign(ex->dims_.size(), 0);
      int64_t acc = 1;
      for (size_t d = ex->dims_.size(); d-- > 0;) {
        if (bcast[i][d]) continue;
        in.stride[d] = acc;
        acc *= ex->dims_[d];
      }
    }
  }
  // The last instruction writes straight into its output when the storage
  // is its register type.
  ex->direct_output_.assign(program.instrs.size(), -1);
  const int last = static_cast<int>(program.instrs.size()) - 1;
  for (size_t k = 0; k < program.results.size(); ++k) {
    if (program.results[k] == last && NativeStorage(out_dtypes[k])) {
      ex->direct_output_[last] = static_cast<int>(k);
      break;
    }
  }
  // Scratch slots by liveness: a slot is reused once its value is dead.
  std::vector<int> free_slots, slot_of(last_use.size(), -1);
  std::vector<bool> released(last_use.size(), false);
  auto take = [&]() {
    if (!free_slots.empty()) {
      const int s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return ex->num_slots_++;
  };
  for (size_t i = 0; i < nin; ++i) {
    InputPlan& in = ex->inputs_[i];
    if (in.fetch == Fetch::kUnused || (in.fetch == Fetch::kContiguous && in.native)) continue;
    in.slot = slot_of[i] = take();
  }
  ex->instr_slot_.assign(program.instrs.size(), -1);
  for (int j = 0; j <= last; ++j) {
    for (size_t v = 0; v < last_use.size(); ++v) {
      if (slot_of[v] >= 0 && !released[v] && last_use[v] < j) {
        released[v] = true;
        free_slots.push_back(slot_of[v]);
      }
    }
    if (ex->direct_output_[j] >= 0) continue;
    ex->instr_slot_[j] = slot_of[nin + j] = take();
  }
  // Blocks: whole-row chunks when rows are long, so broadcast rows are read
  // in place; flat blocks otherwise.
  ex->row_ = ex->dims_.back();
  if (ex->row_ >= kBlock / 4) {
    ex->chunks_per_row_ = (ex->row_ + kBlock - 1) / kBlock;
    ex->chunk_ = (ex->row_ + ex->chunks_per_row_ - 1) / ex->chunks_per_row_;
    ex->units_ = ex->total_ / ex->row_ * ex->chunks_per_row_;
  } else {
    ex->chunk_ = kBlock;
    ex->units_ = (ex->total_ + kBlock - 1) / kBlock;
  }
  int weight = 1;
  for (const Instr& in : program.instrs) weight += Weight(in);
  const int64_t min_elems = std::max<int64_t>(4096, (int64_t{1} << 18) / weight);
  ex->grain_units_ = std::max<int64_t>(1, min_elems / std::max<int64_t>(ex->chunk_, 1));
  ex->program_ = std::move(program);
  ex->out_dtypes_ = std::move(out_dtypes);
  return ex;
}

Executor::Block Executor::UnitAt(int64_t u) const {
  if (chunks_per_row_ > 0) {
    const int64_t row = u / chunks_per_row_, c = u % chunks_per_row_;
    const int64_t begin = c * chunk_;
    return {row * row_ + begin, std::min(chunk_, row_ - begin)};
  }
  const int64_t begin = u * kBlock;
  return {begin, std::min(kBlock, total_ - begin)};
}

const void* Executor::FetchInput(const InputPlan& in, const void* base, int64_t offset, int64_t len,
                                 void* slot) const {
  const int64_t esize = ElementSize(in.dtype);
  const char* src = static_cast<const char*>(base);
  switch (in.fetch) {
    case Fetch::kContiguous:
      if (in.native) return src + offset * esize;
      Load(src + offset * esize, in.dtype, 1, len, slot);
      return slot;
    case Fetch::kScalar:
      Load(src, in.dtype, 0, len, slot);
      return slot;
    case Fetch::kStrided:
      break;
    case Fetch::kUnused:
      return nullptr;
  }
  const int r = static_cast<int>(dims_.size());
  absl::InlinedVector<int64_t, 8> idx(r);
  int64_t rem = offset, pos = 0;
  for (int d = r - 1; d >= 0; --d) {
    idx[d] = rem % dims_[d];
    rem /= dims_[d];
    pos += idx[d] * in.stride[d];
  }
  const int64_t inner = dims_[r - 1], inner_stride = in.stride[r - 1];
  if (idx[r - 1] + len <= inner) {  // one run: in place or one converting load
    if (inner_stride == 1 && in.native) return src + pos * esize;
    Load(src + pos * esize, in.dtype, inner_stride, len, slot);
    return slot;
  }
  const int64_t rsize = RegSize(ClassOf(in.dtype));
  char* dst = static_cast<char*>(slot);
  for (int64_t filled = 0; filled < len;) {
    const int64_t seg = std::min(inner - idx[r - 1], len - filled);
    Load(src + pos * esize, in.dtype, inner_stride, seg, dst + filled * rsize);
    filled += seg;
    idx[r - 1] += seg;
    pos += seg * inner_stride;
    if (idx[r - 1] < inner) continue;
    pos -= inner * inner_stride;
    idx[r - 1] = 0;
    for (int d = r - 2; d >= 0; --d) {
      ++idx[d];
      pos += in.stride[d];
      if (idx[d] < dims_[d]) break;
      pos -= dims_[d] * in.stride[d];
      idx[d] = 0;
    }
  }
  return slot;
}

void Executor::RunUnits(int64_t begin, int64_t end, std::span<const void* const> inputs,
                        std::span<void* const> outputs) const {
  const size_t nin = inputs_.size();
  std::unique_ptr<int64_t[]> scratch(new int64_t[std::max(num_slots_, 1) * kBlock]);
  auto slot = [&](int s) -> void* { return s < 0 ? nullptr : scratch.get() + s * kBlock; };
  absl::InlinedVector<const void*, 32> regs(nin + program_.instrs.size(), nullptr);
  for (int64_t u = begin; u < end; ++u) {
    const Block b = UnitAt(u);
    for (size_t i = 0; i < nin; ++i) {
      if (inputs_[i].fetch == Fetch::kUnused) continue;
      regs[i] = FetchInput(inputs_[i], inputs[i], b.offset, b.len, slot(inputs_[i].slot));
    }
    for (size_t j = 0; j < program_.instrs.size(); ++j) {
      const Instr& in = program_.instrs[j];
      void* dst = slot(instr_slot_[j]);
      if (direct_output_[j] >= 0) {
        dst =
            static_cast<char*>(outputs[direct_output_[j]]) + b.offset * RegSize(ClassOf(in.dtype));
      }
      Exec(in, regs.data(), dst, b.len);
      regs[nin + j] = dst;
    }
    for (size_t k = 0; k < program_.results.size(); ++k) {
      void* out = static_cast<char*>(outputs[k]) + b.offset * ElementSize(out_dtypes_[k]);
      const void* src = regs[nin + program_.results[k]];
      if (src != out) Store(src, out_dtypes_[k], b.len, out);
    }
  }
}

void Executor::Run(std::span<const void* const> inputs, std::span<void* const> outputs) const {
  if (total_ == 0) return;
  ParallelFor(units_, grain_units_,
              [&](int64_t begin, int64_t end) { RunUnits(begin, end, inputs, outputs); });
}

}  // namespace kiln::cpu::ew
