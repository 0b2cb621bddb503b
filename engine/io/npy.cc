#include "engine/io/npy.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

struct NpyType {
  DType dtype;
  const char* descr;  // what we write; reading also accepts '=' and '|'/'<' for bytes
};

constexpr NpyType kTypes[] = {
    {v1::DTYPE_F32, "<f4"},  {v1::DTYPE_F16, "<f2"}, {v1::DTYPE_F64, "<f8"},
    {v1::DTYPE_I8, "|i1"},   {v1::DTYPE_U8, "|u1"},  {v1::DTYPE_I16, "<i2"},
    {v1::DTYPE_I32, "<i4"},  {v1::DTYPE_I64, "<i8"}, {v1::DTYPE_BOOL, "|b1"},
    {v1::DTYPE_BF16, "<u2"},
};

// The header is a Python dict literal with exactly the keys 'descr',
// 'fortran_order' and 'shape' (numpy.lib.format writes nothing else). This
// cursor reads just that grammar.
class HeaderReader {
 public:
  explicit HeaderReader(std::string_view s) : s_(s) {}

  void SkipSpace() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(std::string_view w) {
    SkipSpace();
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  std::optional<std::string> String() {
    SkipSpace();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return std::nullopt;
    const char quote = s_[pos_++];
    const size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) return std::nullopt;
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  std::optional<int64_t> Int() {
    SkipSpace();
    const size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == start || pos_ - start > 18) return std::nullopt;
    const int64_t v = std::stoll(std::string(s_.substr(start, pos_ - start)));
    if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 longs
    return v;
  }
  std::optional<Dims> Shape() {
    if (!Consume('(')) return std::nullopt;
    Dims dims;
    while (!Consume(')')) {
      auto d = Int();
      if (!d) return std::nullopt;
      dims.push_back(*d);
      if (!Consume(',')) {
        if (!Consume(')')) return std::nullopt;
        break;
      }
    }
    return dims;
  }
  std::string_view rest() const { return s_.substr(pos_); }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

absl::StatusOr<DType> DTypeFromDescr(const std::string& descr, const std::string& what) {
  if (descr.size() >= 2) {
    const char order = descr[0];
    const std::string code = descr.substr(1);
    for (const NpyType& t : kTypes) {
      if (code != std::string_view(t.descr).substr(1)) continue;
      const bool one_byte = ElementSize(t.dtype) == 1;
      if (order == '<' || order == '=' || order == '|' || (one_byte && order == '>')) {
        return t.dtype;
      }
      if (order == '>') {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": big-endian .npy data ('", descr,
            "') is not supported; re-save it with a.astype(a.dtype.newbyteorder('<'))"));
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": unsupported .npy dtype '", descr,
                   "'; kiln reads f32, f16, f64, i8, u8, i16, i32, i64, bool (and u16 as bf16)"));
}

}  // namespace

absl::StatusOr<HostTensor> ParseNpy(std::string_view bytes, const std::string& what) {
  if (bytes.size() < 10 || bytes.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a .npy file (bad magic)"));
  }
  const auto major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12)
      return absl::InvalidArgumentError(absl::StrCat(what, ": truncated header"));
    for (int i = 0; i < 4; ++i) header_len |= size_t{static_cast<uint8_t>(bytes[8 + i])} << (8 * i);
    header_start = 12;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": .npy format version ", major, " is not supported (1, 2, 3 are)"));
  }
  if (bytes.size() < header_start + header_len) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": truncated header"));
  }
  const std::string_view header = bytes.substr(header_start, header_len);
  auto malformed = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": malformed .npy header (", why, "): ", std::string(header)));
  };

  HeaderReader r(header);
  if (!r.Consume('{')) return malformed("expected '{'");
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<Dims> shape;
  while (!r.Consume('}')) {
    auto key = r.String();
    if (!key || !r.Consume(':')) return malformed("expected a key");
    if (*key == "descr") {
      descr = r.String();
      if (!descr) return malformed("descr must be a string (structured dtypes are not supported)");
    } else if (*key == "fortran_order") {
      if (r.ConsumeWord("True")) {
        fortran = true;
      } else if (r.ConsumeWord("False")) {
        fortran = false;
      } else {
        return malformed("fortran_order must be True or False");
      }
    } else if (*key == "shape") {
      shape = r.Shape();
      if (!shape) return malformed("shape must be a tuple of ints");
    } else {
      return malformed(absl::StrCat("unknown key '", *key, "'"));
    }
    if (!r.Consume(',')) {
      if (!r.Consume('}')) return malformed("expected ',' or '}'");
      break;
    }
  }
  if (!descr || !fortran || !shape) return malformed("needs descr, fortran_order and shape");
  auto dtype = DTypeFromDescr(*descr, what);
  if (!dtype.ok()) return dtype.status();
  if (*fortran && shape->size() >= 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": Fortran-order .npy arrays are not supported; save np.ascontiguousarray(a)"));
  }
  // The header's shape is checked against the bytes present before anything is
  // allocated: a 100-byte file may claim petabytes.
  auto elements = CheckedNumElements(*shape);
  if (!elements.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", elements.status().message()));
  }
  const std::optional<int64_t> needed = BytesFor(*dtype, *elements);
  if (!needed) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", DimsToString(*shape),
                                                   " of ", *descr, " does not fit in int64 bytes"));
  }
  const std::string_view data = bytes.substr(header_start + header_len);
  if (static_cast<int64_t>(data.size()) < *needed) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": truncated data: ", *descr,
                                                   DimsToString(*shape), " needs ", *needed,
                                                   " bytes, the file has ", data.size()));
  }
  if (static_cast<int64_t>(data.size()) > *needed) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", data.size() - *needed,
                                                   " trailing bytes after the array data"));
  }
  auto t = HostTensor::CreateUninitialized(*dtype, *shape);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", t.status().message()));
  if (t->num_bytes() > 0) std::memcpy(t->data(), data.data(), t->num_bytes());
  if (*dtype == v1::DTYPE_BOOL) {
    const auto* b = static_cast<const uint8_t*>(t->data());
    for (int64_t i = 0; i < t->num_elements(); ++i) {
      if (b[i] > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": bool element ", i, " is ", int{b[i]}, ", not 0 or 1"));
      }
    }
  }
  return t;
}

absl::StatusOr<std::string> SerializeNpy(const HostTensor& tensor) {
  const char* descr = nullptr;
  for (const NpyType& t : kTypes) {
    if (t.dtype == tensor.dtype()) descr = t.descr;
  }
  if (descr == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", DTypeName(tensor.dtype()), " as .npy"));
  }
  std::string shape = absl::StrJoin(tensor.dims(), ", ");
  if (tensor.dims().size() == 1) shape += ",";
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Pad with spaces and end with '\n' so the data starts 64-byte aligned.
  const bool v2 = header.size() + 1 + 10 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');

  std::string out(kMagic);
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back(0);
  const size_t len = header.size();
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i)
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += header;
  out.append(tensor.bytes());
  return out;
}

absl::StatusOr<HostTensor> ReadNpy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ParseNpy(ss.str(), path);
}

absl::Status WriteNpy(const std::string& path, const HostTensor& tensor) {
  auto bytes = SerializeNpy(tensor);
  if (!bytes.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", bytes.status().message()));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  f.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  f.close();
  if (!f) return absl::DataLossError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace kiln
