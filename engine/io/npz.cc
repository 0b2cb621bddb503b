#include "engine/io/npz.h"

#include <zip.h>

#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/io/mapped_file.h"
#include "engine/io/npy.h"

namespace kiln::io {
namespace {

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct FileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};
struct SourceFreer {
  void operator()(zip_source_t* s) const { zip_source_free(s); }
};

std::string ZipError(zip_error_t* e) {
  std::string s = zip_error_strerror(e);
  zip_error_fini(e);
  return s;
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> ParseNpz(std::string_view bytes,
                                                                         const std::string& what,
                                                                         const NpzLimits& limits) {
  const std::string where = QuotedName(what);
  zip_error_t err;
  zip_error_init(&err);
  // The buffer is borrowed (freep = 0): zip_open_from_source reads it in place.
  std::unique_ptr<zip_source_t, SourceFreer> src(zip_source_buffer_create(bytes.data(), bytes.size(), 0, &err));
  if (!src) return absl::InvalidArgumentError(absl::StrCat("npz ", where, ": ", ZipError(&err)));
  zip_error_init(&err);
  std::unique_ptr<zip_t, ZipCloser> z(zip_open_from_source(src.get(), ZIP_RDONLY | ZIP_CHECKCONS, &err));
  if (!z) {
    return absl::InvalidArgumentError(absl::StrCat("npz ", where, " is not a readable zip archive: ", ZipError(&err)));
  }
  zip_source_keep(src.get());  // the archive now holds a reference too
  const zip_int64_t n = zip_get_num_entries(z.get(), 0);
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("npz ", where, ": cannot count its entries"));
  if (n > limits.max_entries) {
    return absl::ResourceExhaustedError(
        absl::StrCat("npz ", where, " has ", n, " entries, over the limit of ", limits.max_entries));
  }
  // Every entry's declared size, before anything is inflated.
  std::vector<zip_stat_t> stats(static_cast<size_t>(n));
  uint64_t total = 0;
  std::set<std::string> names;
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t& st = stats[i];
    zip_stat_init(&st);
    if (zip_stat_index(z.get(), static_cast<zip_uint64_t>(i), 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME) ||
        !(st.valid & ZIP_STAT_SIZE)) {
      return absl::InvalidArgumentError(absl::StrCat("npz ", where, ": entry ", i, " has no readable header"));
    }
    const std::string name = st.name;
    const std::string e = absl::StrCat("npz ", where, ": entry ", QuotedName(name));
    if (!absl::EndsWith(name, ".npy") || name.size() == 4) {
      return absl::InvalidArgumentError(absl::StrCat(e, " is not a .npy file"));
    }
    if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE) {
      return absl::InvalidArgumentError(absl::StrCat(e, " is encrypted"));
    }
    if (!names.insert(name).second) return absl::InvalidArgumentError(absl::StrCat(e, " is given twice"));
    total += st.size;
    if (st.size > static_cast<uint64_t>(limits.max_total_bytes) || total > static_cast<uint64_t>(limits.max_total_bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(e, " takes the archive's inflated size past the limit of ",
                                                       limits.max_total_bytes, " bytes"));
    }
  }
  std::vector<std::pair<std::string, HostTensor>> out;
  for (zip_int64_t i = 0; i < n; ++i) {
    const zip_stat_t& st = stats[i];
    const std::string name = st.name;
    const std::string e = absl::StrCat("npz ", where, ": entry ", QuotedName(name));
    std::unique_ptr<zip_file_t, FileCloser> f(zip_fopen_index(z.get(), static_cast<zip_uint64_t>(i), 0));
    if (!f) {
      return absl::InvalidArgumentError(absl::StrCat(e, " cannot be opened: ", zip_strerror(z.get())));
    }
    std::string data(static_cast<size_t>(st.size), '\0');
    zip_int64_t got = 0;
    while (static_cast<uint64_t>(got) < st.size) {
      const zip_int64_t r = zip_fread(f.get(), data.data() + got, st.size - static_cast<uint64_t>(got));
      if (r < 0) return absl::InvalidArgumentError(absl::StrCat(e, " is corrupt: ", zip_file_strerror(f.get())));
      if (r == 0) break;
      got += r;
    }
    char extra;
    if (static_cast<uint64_t>(got) != st.size || zip_fread(f.get(), &extra, 1) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(e, " inflates to a size other than its declared ", st.size, " bytes"));
    }
    absl::StatusOr<HostTensor> t = ParseNpy(data, absl::StrCat(what, ":", name));
    if (!t.ok()) return t.status();
    out.emplace_back(name.substr(0, name.size() - 4), *std::move(t));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> ReadNpz(const std::string& path,
                                                                        const NpzLimits& limits) {
  KILN_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(path, int64_t{1} << 40, "npz"));
  return ParseNpz(f.bytes(), path, limits);
}

absl::StatusOr<std::string> SerializeNpz(const std::vector<std::pair<std::string, const HostTensor*>>& tensors) {
  zip_error_t err;
  zip_error_init(&err);
  std::unique_ptr<zip_source_t, SourceFreer> out(zip_source_buffer_create(nullptr, 0, 0, &err));
  if (!out) return absl::InternalError(absl::StrCat("npz: ", ZipError(&err)));
  zip_error_init(&err);
  std::unique_ptr<zip_t, ZipCloser> z(zip_open_from_source(out.get(), ZIP_TRUNCATE, &err));
  if (!z) return absl::InternalError(absl::StrCat("npz: ", ZipError(&err)));
  zip_source_keep(out.get());
  std::vector<std::string> blobs;
  blobs.reserve(tensors.size());
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || t == nullptr) return absl::InvalidArgumentError("npz: a tensor needs a name and a value");
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("npz: tensor ", QuotedName(name), " is given twice"));
    }
    KILN_ASSIGN_OR_RETURN(std::string blob, SerializeNpy(*t));
    blobs.push_back(std::move(blob));
    zip_source_t* s = zip_source_buffer(z.get(), blobs.back().data(), blobs.back().size(), 0);
    if (s == nullptr) return absl::InternalError(absl::StrCat("npz: ", zip_strerror(z.get())));
    const zip_int64_t idx = zip_file_add(z.get(), (name + ".npy").c_str(), s, ZIP_FL_ENC_UTF_8);
    if (idx < 0) {
      zip_source_free(s);
      return absl::InternalError(absl::StrCat("npz: ", zip_strerror(z.get())));
    }
    zip_set_file_compression(z.get(), static_cast<zip_uint64_t>(idx), ZIP_CM_STORE, 0);
  }
  if (zip_close(z.get()) != 0) return absl::InternalError(absl::StrCat("npz: ", zip_strerror(z.get())));
  (void)z.release();  // closed
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_source_stat(out.get(), &st) != 0 || zip_source_open(out.get()) != 0) {
    return absl::InternalError("npz: cannot read the written archive back");
  }
  std::string bytes(static_cast<size_t>(st.size), '\0');
  const zip_int64_t r = zip_source_read(out.get(), bytes.data(), st.size);
  zip_source_close(out.get());
  if (r < 0 || static_cast<zip_uint64_t>(r) != st.size) return absl::InternalError("npz: short read of the archive");
  return bytes;
}

}  // namespace kiln::io
