#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/mapped_file.h"
#include "nlohmann/json.hpp"

namespace kiln::io {
namespace {

using json = nlohmann::json;

constexpr std::pair<std::string_view, DType> kDTypes[] = {
    {"F64", v1::DTYPE_F64}, {"F32", v1::DTYPE_F32}, {"F16", v1::DTYPE_F16},
    {"BF16", v1::DTYPE_BF16}, {"I64", v1::DTYPE_I64}, {"I32", v1::DTYPE_I32},
    {"I16", v1::DTYPE_I16}, {"I8", v1::DTYPE_I8},   {"U8", v1::DTYPE_U8},
    {"BOOL", v1::DTYPE_BOOL},
};

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

// The format nests three levels ({name: {field: [dims]}}); deeper JSON is
// refused before the recursive parser sees it.
absl::Status CheckNesting(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > 3) return Invalid("header nests deeper than the format's three levels");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> NonNegativeInt(const json& v, const std::string& what) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(kInt64Max)) return Invalid(absl::StrCat(what, " overflows int64"));
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return Invalid(absl::StrCat(what, " is negative (", s, ")"));
    return s;
  }
  return Invalid(absl::StrCat(what, " is not an integer"));
}

absl::Status Errno(const char* what, const std::string& path) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors: ", what, " ", QuotedName(path), ": ", std::strerror(errno)));
}

}  // namespace

struct SafetensorsFile::Mapping {
  MappedFile file;
};

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

std::optional<DType> SafetensorsDType(std::string_view name) {
  for (const auto& [n, d] : kDTypes) {
    if (n == name) return d;
  }
  return std::nullopt;
}

std::string_view SafetensorsDTypeName(DType dtype) {
  for (const auto& [n, d] : kDTypes) {
    if (d == dtype) return n;
  }
  return {};
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path,
                                                      const SafetensorsLimits& limits) {
  KILN_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path, limits.max_file_bytes, "safetensors"));
  SafetensorsFile file;
  file.mapping_ = std::make_unique<Mapping>(Mapping{std::move(mapped)});
  if (absl::Status s = file.Parse(limits); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (in ", QuotedName(path), ")"));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes,
                                                           const SafetensorsLimits& limits) {
  SafetensorsFile file;
  file.mapping_ = std::make_unique<Mapping>(Mapping{MappedFile::FromString(std::move(bytes))});
  KILN_RETURN_IF_ERROR(file.Parse(limits));
  return file;
}

absl::Status SafetensorsFile::Parse(const SafetensorsLimits& limits) {
  const std::string_view all = mapping_->file.bytes();
  if (all.size() < 8) {
    return Invalid(absl::StrCat("file is ", all.size(), " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(all[i]);
  if (header_len > static_cast<uint64_t>(limits.max_header_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("safetensors: header of ", header_len, " bytes is over the limit of ",
                     limits.max_header_bytes));
  }
  if (header_len > all.size() - 8) {
    return Invalid(absl::StrCat("header of ", header_len, " bytes runs past the end of the file (",
                                all.size() - 8, " bytes after the length)"));
  }
  const std::string_view header = all.substr(8, header_len);
  data_ = all.substr(8 + header_len);
  if (header.empty() || header.front() != '{') {
    return Invalid("header is not a JSON object");
  }
  KILN_RETURN_IF_ERROR(CheckNesting(header));

  // A name given twice would silently keep one value; the callback sees every
  // key of the top-level object before the parser merges them.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = std::move(key);
    }
    return true;
  };
  json doc = json::parse(header.begin(), header.end(), cb, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Invalid("header is not valid JSON");
  if (!duplicate.empty()) return Invalid(absl::StrCat("tensor ", QuotedName(duplicate), " is given twice"));
  if (!doc.is_object()) return Invalid("header is not a JSON object");
  if (static_cast<int64_t>(doc.size()) > limits.max_tensors + 1) {
    return absl::ResourceExhaustedError(absl::StrCat("safetensors: ", doc.size(),
                                                     " entries, over the limit of ",
                                                     limits.max_tensors, " tensors"));
  }

  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Invalid("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return Invalid(absl::StrCat("__metadata__ value of ", QuotedName(m.key()), " is not a string"));
        }
        metadata_.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const std::string t = absl::StrCat("tensor ", QuotedName(name));
    if (name.empty()) return Invalid("a tensor has an empty name");
    if (!v.is_object()) return Invalid(absl::StrCat(t, " is not an object"));
    SafetensorsEntry e;
    e.name = name;
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) return Invalid(absl::StrCat(t, ": dtype is missing or not a string"));
    const std::string dtype_name = dt->get<std::string>();
    const std::optional<DType> dtype = SafetensorsDType(dtype_name);
    if (!dtype) {
      return Invalid(absl::StrCat(t, ": dtype ", QuotedName(dtype_name),
                                  " is unknown or has no Kiln type (F64 F32 F16 BF16 I64 I32 "
                                  "I16 I8 U8 BOOL)"));
    }
    e.dtype = *dtype;
    const auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array()) return Invalid(absl::StrCat(t, ": shape is missing or not an array"));
    CheckedInt elements = 1;
    for (size_t i = 0; i < shape->size(); ++i) {
      absl::StatusOr<int64_t> d = NonNegativeInt((*shape)[i], absl::StrCat(t, ": shape[", i, "]"));
      if (!d.ok()) return d.status();
      e.dims.push_back(*d);
      elements = elements * *d;
    }
    const CheckedInt bytes = elements * ElementSize(e.dtype);
    if (!bytes.ok()) return Invalid(absl::StrCat(t, ": shape ", DimsToString(e.dims), " overflows int64 bytes"));
    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2) {
      return Invalid(absl::StrCat(t, ": data_offsets is missing or not [begin, end]"));
    }
    absl::StatusOr<int64_t> begin = NonNegativeInt((*off)[0], absl::StrCat(t, ": data_offsets[0]"));
    if (!begin.ok()) return begin.status();
    absl::StatusOr<int64_t> end = NonNegativeInt((*off)[1], absl::StrCat(t, ": data_offsets[1]"));
    if (!end.ok()) return end.status();
    if (*end < *begin) return Invalid(absl::StrCat(t, ": data_offsets end ", *end, " is before begin ", *begin));
    if (*end > static_cast<int64_t>(data_.size())) {
      return Invalid(absl::StrCat(t, ": data_offsets end ", *end, " runs past the data buffer (",
                                  data_.size(), " bytes)"));
    }
    if (*end - *begin != bytes.get()) {
      return Invalid(absl::StrCat(t, ": data_offsets span ", *end - *begin, " bytes but ",
                                  dtype_name, DimsToString(e.dims), " needs ", bytes.get()));
    }
    e.offset = *begin;
    e.size = bytes.get();
    tensors_.push_back(std::move(e));
  }

  // The buffer is covered exactly: sorted by offset, each tensor starts where
  // the previous one ended, and the last ends at the buffer's end.
  std::vector<const SafetensorsEntry*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const SafetensorsEntry& e : tensors_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->size < b->size;
  });
  int64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->offset < cursor) {
      return Invalid(absl::StrCat("tensor ", QuotedName(e->name), " (bytes ", e->offset, "..", e->offset + e->size,
                                  ") overlaps tensor ", QuotedName(previous->name)));
    }
    if (e->offset > cursor) {
      return Invalid(absl::StrCat("bytes ", cursor, "..", e->offset, " of the data buffer belong to no tensor"));
    }
    cursor = e->offset + e->size;
    previous = e;
  }
  if (cursor != static_cast<int64_t>(data_.size())) {
    return Invalid(absl::StrCat("bytes ", cursor, "..", data_.size(), " of the data buffer belong to no tensor"));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
  return absl::OkStatus();
}

const SafetensorsEntry* SafetensorsFile::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const SafetensorsEntry& e, std::string_view n) { return e.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::string_view SafetensorsFile::Bytes(const SafetensorsEntry& entry) const {
  return data_.substr(static_cast<size_t>(entry.offset), static_cast<size_t>(entry.size));
}

absl::StatusOr<HostTensor> SafetensorsFile::Read(std::string_view name) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("safetensors: no tensor ", QuotedName(name)));
  return HostTensor::FromBytes(e->dtype, e->dims, Bytes(*e));
}

absl::StatusOr<std::string> SerializeSafetensors(std::span<const SafetensorsItem> tensors,
                                                 const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsItem*> sorted;
  sorted.reserve(tensors.size());
  for (const SafetensorsItem& item : tensors) {
    if (item.first.empty()) return Invalid("a tensor to write has an empty name");
    if (item.first == "__metadata__") return Invalid("a tensor cannot be named __metadata__");
    if (item.second == nullptr) return Invalid(absl::StrCat("tensor ", QuotedName(item.first), " has no value"));
    if (SafetensorsDTypeName(item.second->dtype()).empty()) {
      return Invalid(absl::StrCat("tensor ", QuotedName(item.first), ": dtype ",
                                  DTypeName(item.second->dtype()), " has no safetensors type"));
    }
    sorted.push_back(&item);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->first == sorted[i - 1]->first) {
      return Invalid(absl::StrCat("tensor ", QuotedName(sorted[i]->first), " is given twice"));
    }
  }
  // nlohmann's object keeps keys sorted, "__metadata__" first (underscore
  // sorts before lower-case letters but after digits and capitals: the order
  // is std::map's, the same every time).
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  CheckedInt offset = 0;
  for (const SafetensorsItem* item : sorted) {
    const HostTensor& t = *item->second;
    const CheckedInt end = offset + t.num_bytes();
    if (!end.ok()) return Invalid("the tensors' total size overflows int64");
    header[item->first] = {{"dtype", std::string(SafetensorsDTypeName(t.dtype()))},
                           {"shape", t.dims()},
                           {"data_offsets", {offset.get(), end.get()}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::strict);
  } catch (const json::exception& e) {  // a name or value that is not UTF-8
    return Invalid(absl::StrCat("cannot write the header: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + static_cast<size_t>(offset.get()));
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += text;
  for (const SafetensorsItem* item : sorted) out += item->second->bytes();
  return out;
}

absl::Status WriteSafetensors(const std::string& path, std::span<const SafetensorsItem> tensors,
                              const std::map<std::string, std::string>& metadata) {
  KILN_ASSIGN_OR_RETURN(const std::string bytes_value, SerializeSafetensors(tensors, metadata));
  const std::string* bytes = &bytes_value;
  std::string temp = path + ".tmp.XXXXXX";
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) return Errno("cannot create a file beside", path);
  size_t done = 0;
  while (done < bytes->size()) {
    const ssize_t n = ::write(fd, bytes->data() + done, bytes->size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = Errno("cannot write", temp);
      ::close(fd);
      ::unlink(temp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0) {
    absl::Status s = Errno("cannot sync", temp);
    ::close(fd);
    ::unlink(temp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status s = Errno("cannot rename onto", path);
    ::unlink(temp.c_str());
    return s;
  }
  return absl::OkStatus();
}

}  // namespace kiln::io
