#include "engine/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kiln::io {

std::string QuotedName(std::string_view name) {
  constexpr size_t kMax = 120;
  std::string out = absl::CHexEscape(std::string(name.substr(0, kMax)));
  if (name.size() > kMax) absl::StrAppend(&out, "...");
  return absl::StrCat("'", out, "'");
}

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path, int64_t max_bytes,
                                            std::string_view format_view) {
  const std::string format(format_view);
  auto fail = [&](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat(format, ": ", what, " ", QuotedName(path), ": ", std::strerror(errno)));
  };
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(format, ": no file ", QuotedName(path)));
    return fail("cannot open");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    absl::Status s = fail("cannot stat");
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(format, ": ", QuotedName(path), " is not a regular file"));
  }
  if (st.st_size > max_bytes) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(format, ": ", QuotedName(path), " is ", st.st_size,
                                                     " bytes, over the limit of ", max_bytes));
  }
  MappedFile file;
  if (st.st_size > 0) {
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      absl::Status s = fail("cannot map");
      ::close(fd);
      return s;
    }
    file.map_ = map;
    file.map_size_ = static_cast<size_t>(st.st_size);
    file.bytes_ = {static_cast<const char*>(map), file.map_size_};
  }
  ::close(fd);
  return file;
}

MappedFile MappedFile::FromString(std::string bytes) {
  MappedFile file;
  file.owned_ = std::move(bytes);
  file.bytes_ = file.owned_;
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this == &other) return *this;
  Reset();
  const bool owned = other.map_ == nullptr;
  owned_ = std::move(other.owned_);
  map_ = std::exchange(other.map_, nullptr);
  map_size_ = std::exchange(other.map_size_, 0);
  bytes_ = owned ? std::string_view(owned_) : other.bytes_;
  other.bytes_ = {};
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  owned_.clear();
  bytes_ = {};
}

}  // namespace kiln::io
