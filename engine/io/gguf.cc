#include "engine/io/gguf.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/mapped_file.h"

namespace kiln::io {
namespace {

// ggml's tensor types (ggml.h, enum ggml_type) with their block shape. Kiln
// reads those with a dtype; the others are sized, listed, and refused on Read.
struct GgmlType {
  uint32_t id;
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
  DType dtype;
};
constexpr GgmlType kGgmlTypes[] = {
    {0, "f32", 1, 4, v1::DTYPE_F32},       {1, "f16", 1, 2, v1::DTYPE_F16},
    {2, "q4_0", 32, 18, v1::DTYPE_Q4_0},    {3, "q4_1", 32, 20, v1::DTYPE_UNSPECIFIED},
    {6, "q5_0", 32, 22, v1::DTYPE_UNSPECIFIED}, {7, "q5_1", 32, 24, v1::DTYPE_UNSPECIFIED},
    {8, "q8_0", 32, 34, v1::DTYPE_Q8_0},    {9, "q8_1", 32, 36, v1::DTYPE_UNSPECIFIED},
    {10, "q2_k", 256, 84, v1::DTYPE_UNSPECIFIED}, {11, "q3_k", 256, 110, v1::DTYPE_UNSPECIFIED},
    {12, "q4_k", 256, 144, v1::DTYPE_Q4_K}, {13, "q5_k", 256, 176, v1::DTYPE_Q5_K},
    {14, "q6_k", 256, 210, v1::DTYPE_Q6_K}, {15, "q8_k", 256, 292, v1::DTYPE_UNSPECIFIED},
    {24, "i8", 1, 1, v1::DTYPE_I8},         {25, "i16", 1, 2, v1::DTYPE_I16},
    {26, "i32", 1, 4, v1::DTYPE_I32},       {27, "i64", 1, 8, v1::DTYPE_I64},
    {28, "f64", 1, 8, v1::DTYPE_F64},       {30, "bf16", 1, 2, v1::DTYPE_BF16},
};

const GgmlType* FindType(uint32_t id) {
  for (const GgmlType& t : kGgmlTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

// GGUF metadata value types and the bytes of the fixed-size ones.
enum : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
int64_t FixedSize(uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    default: return 0;
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("gguf: ", what));
}
absl::Status Exhausted(const std::string& what) {
  return absl::ResourceExhaustedError(absl::StrCat("gguf: ", what));
}

// A bounds-checked little-endian cursor over the file's bytes.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  int64_t pos() const { return pos_; }
  int64_t remaining() const { return static_cast<int64_t>(bytes_.size()) - pos_; }

  absl::Status Need(int64_t n, const std::string& what) const {
    if (n < 0 || n > remaining()) {
      return Invalid(absl::StrCat(what, " needs ", n, " bytes at offset ", pos_, " but the file has ",
                                  remaining(), " left"));
    }
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Get(const std::string& what) {
    KILN_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));  // x86-64 and aarch64 are little-endian
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<std::string> String(const std::string& what, int64_t max_bytes) {
    KILN_ASSIGN_OR_RETURN(const uint64_t n, Get<uint64_t>(absl::StrCat(what, " length")));
    if (n > static_cast<uint64_t>(max_bytes)) {
      return Exhausted(absl::StrCat(what, " is ", n, " bytes, over the limit of ", max_bytes));
    }
    KILN_RETURN_IF_ERROR(Need(static_cast<int64_t>(n), what));
    std::string s(bytes_.substr(static_cast<size_t>(pos_), static_cast<size_t>(n)));
    pos_ += static_cast<int64_t>(n);
    return s;
  }

 private:
  std::string_view bytes_;
  int64_t pos_ = 0;
};

absl::Status ReadValue(Reader& r, uint32_t type, const GgufLimits& limits, const std::string& what,
                       int depth, GgufValue* out) {
  out->type = type;
  switch (type) {
    case kU8: { KILN_ASSIGN_OR_RETURN(uint8_t v, r.Get<uint8_t>(what)); out->u = v; return absl::OkStatus(); }
    case kI8: { KILN_ASSIGN_OR_RETURN(int8_t v, r.Get<int8_t>(what)); out->i = v; return absl::OkStatus(); }
    case kU16: { KILN_ASSIGN_OR_RETURN(uint16_t v, r.Get<uint16_t>(what)); out->u = v; return absl::OkStatus(); }
    case kI16: { KILN_ASSIGN_OR_RETURN(int16_t v, r.Get<int16_t>(what)); out->i = v; return absl::OkStatus(); }
    case kU32: { KILN_ASSIGN_OR_RETURN(uint32_t v, r.Get<uint32_t>(what)); out->u = v; return absl::OkStatus(); }
    case kI32: { KILN_ASSIGN_OR_RETURN(int32_t v, r.Get<int32_t>(what)); out->i = v; return absl::OkStatus(); }
    case kU64: { KILN_ASSIGN_OR_RETURN(uint64_t v, r.Get<uint64_t>(what)); out->u = v; return absl::OkStatus(); }
    case kI64: { KILN_ASSIGN_OR_RETURN(int64_t v, r.Get<int64_t>(what)); out->i = v; return absl::OkStatus(); }
    case kF32: { KILN_ASSIGN_OR_RETURN(float v, r.Get<float>(what)); out->f = v; return absl::OkStatus(); }
    case kF64: { KILN_ASSIGN_OR_RETURN(double v, r.Get<double>(what)); out->f = v; return absl::OkStatus(); }
    case kBool: {
      KILN_ASSIGN_OR_RETURN(uint8_t v, r.Get<uint8_t>(what));
      if (v > 1) return Invalid(absl::StrCat(what, " is a bool of value ", v));
      out->i = v;
      return absl::OkStatus();
    }
    case kString: {
      KILN_ASSIGN_OR_RETURN(out->s, r.String(what, limits.max_string_bytes));
      return absl::OkStatus();
    }
    case kArray: {
      if (depth >= 2) return Invalid(absl::StrCat(what, " nests arrays deeper than 2"));
      KILN_ASSIGN_OR_RETURN(out->array_type, r.Get<uint32_t>(absl::StrCat(what, " element type")));
      KILN_ASSIGN_OR_RETURN(const uint64_t n, r.Get<uint64_t>(absl::StrCat(what, " count")));
      if (n > static_cast<uint64_t>(limits.max_array_elements)) {
        return Exhausted(absl::StrCat(what, " has ", n, " elements, over the limit of ",
                                      limits.max_array_elements));
      }
      // Every element takes at least one byte (a string its 8-byte length):
      // a count the file cannot hold is refused before anything is reserved.
      const int64_t min_each = out->array_type == kString ? 8
                               : out->array_type == kArray ? 12
                                                           : FixedSize(out->array_type);
      if (min_each == 0) {
        return Invalid(absl::StrCat(what, " has element type ", out->array_type, ", not a GGUF type"));
      }
      KILN_RETURN_IF_ERROR(r.Need((CheckedInt(static_cast<int64_t>(n)) * min_each).value().value_or(-1),
                                  absl::StrCat(what, " of ", n, " elements")));
      out->array.resize(static_cast<size_t>(n));
      for (uint64_t k = 0; k < n; ++k) {
        KILN_RETURN_IF_ERROR(ReadValue(r, out->array_type, limits, absl::StrCat(what, "[", k, "]"),
                                       depth + 1, &out->array[k]));
      }
      return absl::OkStatus();
    }
    default:
      return Invalid(absl::StrCat(what, " has value type ", type, ", not a GGUF type"));
  }
}

}  // namespace

bool GgufValue::is_integer() const {
  return type == kU8 || type == kI8 || type == kU16 || type == kI16 || type == kU32 ||
         type == kI32 || type == kU64 || type == kI64;
}

std::optional<int64_t> GgufValue::AsInt() const {
  if (type == kU8 || type == kU16 || type == kU32 || type == kU64) {
    if (u > static_cast<uint64_t>(kInt64Max)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (type == kI8 || type == kI16 || type == kI32 || type == kI64) return i;
  return std::nullopt;
}

struct GgufFile::Mapping {
  MappedFile file;
};

GgufFile::~GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path, const GgufLimits& limits) {
  KILN_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path, limits.max_file_bytes, "gguf"));
  GgufFile file;
  file.mapping_ = std::make_unique<Mapping>(Mapping{std::move(mapped)});
  if (absl::Status s = file.Parse(limits); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (in ", QuotedName(path), ")"));
  }
  return file;
}

absl::StatusOr<GgufFile> GgufFile::FromBytes(std::string bytes, const GgufLimits& limits) {
  GgufFile file;
  file.mapping_ = std::make_unique<Mapping>(Mapping{MappedFile::FromString(std::move(bytes))});
  KILN_RETURN_IF_ERROR(file.Parse(limits));
  return file;
}

absl::Status GgufFile::Parse(const GgufLimits& limits) {
  const std::string_view all = mapping_->file.bytes();
  Reader r(all);
  KILN_ASSIGN_OR_RETURN(const uint32_t magic, r.Get<uint32_t>("the magic"));
  if (magic != 0x46554747) return Invalid("not a GGUF file (the magic is not \"GGUF\")");
  KILN_ASSIGN_OR_RETURN(version_, r.Get<uint32_t>("the version"));
  if (version_ != 2 && version_ != 3) {
    return Invalid(absl::StrCat("version ", version_, " is not supported (2 and 3 are)"));
  }
  KILN_ASSIGN_OR_RETURN(const uint64_t n_tensors, r.Get<uint64_t>("the tensor count"));
  KILN_ASSIGN_OR_RETURN(const uint64_t n_kv, r.Get<uint64_t>("the metadata count"));
  if (n_tensors > static_cast<uint64_t>(limits.max_tensors)) {
    return Exhausted(absl::StrCat(n_tensors, " tensors, over the limit of ", limits.max_tensors));
  }
  if (n_kv > static_cast<uint64_t>(limits.max_metadata)) {
    return Exhausted(absl::StrCat(n_kv, " metadata entries, over the limit of ", limits.max_metadata));
  }
  for (uint64_t k = 0; k < n_kv; ++k) {
    KILN_ASSIGN_OR_RETURN(std::string key, r.String(absl::StrCat("metadata key ", k), 1 << 16));
    const std::string what = absl::StrCat("metadata ", QuotedName(key));
    KILN_ASSIGN_OR_RETURN(const uint32_t type, r.Get<uint32_t>(absl::StrCat(what, " type")));
    GgufValue value;
    KILN_RETURN_IF_ERROR(ReadValue(r, type, limits, what, 0, &value));
    if (!metadata_.emplace(std::move(key), std::move(value)).second) {
      return Invalid(absl::StrCat(what, " is given twice"));
    }
  }
  if (const GgufValue* a = FindMetadata("general.alignment")) {
    const std::optional<int64_t> v = a->AsInt();
    if (!v || *v <= 0 || (*v & (*v - 1)) != 0 || *v > (1 << 20)) {
      return Invalid("general.alignment is not a power of two up to 1 MiB");
    }
    alignment_ = *v;
  }

  tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, static_cast<uint64_t>(r.remaining() / 24 + 1))));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    KILN_ASSIGN_OR_RETURN(t.name, r.String(absl::StrCat("tensor ", k, " name"), 1 << 16));
    const std::string what = absl::StrCat("tensor ", QuotedName(t.name));
    KILN_ASSIGN_OR_RETURN(const uint32_t n_dims, r.Get<uint32_t>(absl::StrCat(what, " rank")));
    if (n_dims > 8) return Invalid(absl::StrCat(what, " has rank ", n_dims, " (at most 8)"));
    std::vector<int64_t> ne(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      KILN_ASSIGN_OR_RETURN(const uint64_t v, r.Get<uint64_t>(absl::StrCat(what, " dim ", d)));
      if (v > static_cast<uint64_t>(kInt64Max)) return Invalid(absl::StrCat(what, " dim ", d, " overflows int64"));
      ne[d] = static_cast<int64_t>(v);
    }
    // In Kiln's order (ne reversed), as HostTensor counts: a zero dim after
    // two huge ones does not make their product fit.
    CheckedInt elements = 1;
    for (auto d = ne.rbegin(); d != ne.rend(); ++d) elements = elements * *d;
    KILN_ASSIGN_OR_RETURN(t.ggml_type, r.Get<uint32_t>(absl::StrCat(what, " type")));
    const GgmlType* type = FindType(t.ggml_type);
    if (type == nullptr) return Invalid(absl::StrCat(what, " has ggml type ", t.ggml_type, ", which Kiln does not know"));
    t.type_name = type->name;
    t.dtype = type->dtype;
    KILN_ASSIGN_OR_RETURN(const uint64_t offset, r.Get<uint64_t>(absl::StrCat(what, " offset")));
    if (offset > static_cast<uint64_t>(kInt64Max)) return Invalid(absl::StrCat(what, " offset overflows int64"));
    t.offset = static_cast<int64_t>(offset);
    if (t.offset % alignment_ != 0) {
      return Invalid(absl::StrCat(what, " offset ", t.offset, " is not a multiple of the alignment ", alignment_));
    }
    if (!elements.ok()) return Invalid(absl::StrCat(what, " has an element count that overflows int64"));
    // A block type's rows (ne[0]) are whole blocks.
    if (type->block_elems > 1 && (n_dims == 0 || ne[0] % type->block_elems != 0)) {
      return Invalid(absl::StrCat(what, ": a ", type->name, " row of ", n_dims == 0 ? 1 : ne[0],
                                  " elements is not whole blocks of ", type->block_elems));
    }
    const CheckedInt size = CheckedInt(elements.get() / type->block_elems) * type->block_bytes;
    if (!size.ok()) return Invalid(absl::StrCat(what, " has a byte size that overflows int64"));
    t.size = size.get();
    t.dims.assign(ne.rbegin(), ne.rend());
    if (by_name_.count(t.name) != 0) return Invalid(absl::StrCat(what, " is given twice"));
    by_name_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  const int64_t data_start = (CheckedInt(r.pos()) + alignment_ - 1).get() / alignment_ * alignment_;
  if (data_start > static_cast<int64_t>(all.size())) {
    if (!tensors_.empty()) return Invalid("the data section starts past the end of the file");
    data_ = {};
    return absl::OkStatus();
  }
  data_ = all.substr(static_cast<size_t>(data_start));
  // Inside the data, and no two overlapping (gaps are the alignment padding).
  std::vector<const GgufTensorInfo*> sorted;
  sorted.reserve(tensors_.size());
  for (const GgufTensorInfo& t : tensors_) {
    const CheckedInt end = CheckedInt(t.offset) + t.size;
    if (!end.ok() || end.get() > static_cast<int64_t>(data_.size())) {
      return Invalid(absl::StrCat("tensor ", QuotedName(t.name), " (", t.size, " bytes at data offset ",
                                  t.offset, ") runs past the end of the file"));
    }
    sorted.push_back(&t);
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < sorted.size(); ++k) {
    if (sorted[k]->offset < sorted[k - 1]->offset + sorted[k - 1]->size) {
      return Invalid(absl::StrCat("tensor ", QuotedName(sorted[k]->name), " overlaps tensor ",
                                  QuotedName(sorted[k - 1]->name)));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::FindMetadata(std::string_view key) const {
  auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::string_view GgufFile::Bytes(const GgufTensorInfo& info) const {
  return data_.substr(static_cast<size_t>(info.offset), static_cast<size_t>(info.size));
}

absl::StatusOr<HostTensor> GgufFile::Read(std::string_view name) const {
  const GgufTensorInfo* t = Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("gguf: no tensor ", QuotedName(name)));
  if (t->dtype == v1::DTYPE_UNSPECIFIED) {
    return absl::UnimplementedError(absl::StrCat("gguf: tensor ", QuotedName(name), " is ", t->type_name,
                                                 ", a block type Kiln does not read (it reads f32 f16 "
                                                 "bf16 f64 i8-i64 q8_0 q4_0 q4_k q5_k q6_k)"));
  }
  return HostTensor::FromBytes(t->dtype, t->dims, Bytes(*t));
}

}  // namespace kiln::io
