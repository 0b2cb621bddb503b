#include "backends/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"
#include "base/status.h"

namespace kiln::cpu::ew {
namespace {

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(what); }

// What the CPU implements, on a region the decoder has already checked.
absl::Status CheckImplemented(const Program& p) {
  for (const Instr& in : p.instrs) {
    switch (in.op) {
      case v1::OP_UNARY:
        if (!UnarySupported(in.kind, in.arg_dtype)) {
          return Bad(absl::StrCat(
              "cpu implements unary ", v1::UnaryKind_Name(static_cast<v1::UnaryKind>(in.kind)),
              " on floats (and identity/relu/neg/abs/sign on signed integers), not ",
              DTypeName(in.arg_dtype)));
        }
        break;
      case v1::OP_BINARY:
        if (!BinarySupported(in.kind, in.arg_dtype)) {
          return Bad(absl::StrCat(
              "cpu implements binary ", v1::BinaryKind_Name(static_cast<v1::BinaryKind>(in.kind)),
              " on floats (and every kind but pow on integers), not ", DTypeName(in.arg_dtype)));
        }
        break;
      case v1::OP_CLAMP:
        if (!IsFloat(in.arg_dtype) && !IsInteger(in.arg_dtype)) {
          return Bad(
              absl::StrCat("cpu implements clamp on numbers, not ", DTypeName(in.arg_dtype)));
        }
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
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
  KILN_ASSIGN_OR_RETURN(Program p, backend::DecodeSpec(spec));
  KILN_RETURN_IF_ERROR(CheckImplemented(p));
  return p;
}

std::string ProgramName(const Program& program) {
  if (program.instrs.size() == 1) {
    return absl::StrCat(backend::InstrName(program.instrs[0]), "_",
                        DTypeName(program.instrs[0].dtype));
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
