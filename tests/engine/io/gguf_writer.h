// A small GGUF v3 writer for tests (no model can be downloaded here): metadata
// of every value type, tensors of any ggml type from raw bytes, alignment
// padding. It writes what the format says and nothing Kiln-specific, so the
// reader is tested against the layout rather than against itself; the raw
// fields can be overridden to build hostile files.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kiln::testing {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3, int64_t alignment = 32) : version_(version), alignment_(alignment) {}

  void U32(const std::string& key, uint32_t v) { Kv(key, 4, &v, 4); }
  void I32(const std::string& key, int32_t v) { Kv(key, 5, &v, 4); }
  void F32(const std::string& key, float v) { Kv(key, 6, &v, 4); }
  void U64(const std::string& key, uint64_t v) { Kv(key, 10, &v, 8); }
  void Bool(const std::string& key, bool v) {
    const uint8_t b = v;
    Kv(key, 7, &b, 1);
  }
  void Str(const std::string& key, const std::string& v) {
    ++n_kv_;
    PutString(&kv_, key);
    Put<uint32_t>(&kv_, 8);
    PutString(&kv_, v);
  }
  void StrArray(const std::string& key, const std::vector<std::string>& v) {
    ++n_kv_;
    PutString(&kv_, key);
    Put<uint32_t>(&kv_, 9);
    Put<uint32_t>(&kv_, 8);
    Put<uint64_t>(&kv_, v.size());
    for (const std::string& s : v) PutString(&kv_, s);
  }
  // Raw bytes appended to the metadata section, counted as `entries` entries.
  void RawKv(const std::string& bytes, uint64_t entries) {
    kv_ += bytes;
    n_kv_ += entries;
  }

  // ne: GGUF's dims, fastest first. `offset` < 0: the next aligned offset.
  void Tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t ggml_type,
              const std::string& bytes, int64_t offset = -1) {
    if (offset < 0) {
      offset = static_cast<int64_t>((data_.size() + alignment_ - 1) / alignment_ * alignment_);
    }
    if (static_cast<int64_t>(data_.size()) < offset) data_.resize(static_cast<size_t>(offset), '\0');
    if (static_cast<int64_t>(data_.size()) == offset) {
      data_ += bytes;
    } else if (static_cast<size_t>(offset) + bytes.size() > data_.size()) {
      data_.resize(static_cast<size_t>(offset) + bytes.size(), '\0');
    }
    ++n_tensors_;
    PutString(&infos_, name);
    Put<uint32_t>(&infos_, static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) Put<uint64_t>(&infos_, d);
    Put<uint32_t>(&infos_, ggml_type);
    Put<uint64_t>(&infos_, static_cast<uint64_t>(offset));
  }

  std::string Bytes(uint64_t tensor_count_override = UINT64_MAX) const {
    std::string out = "GGUF";
    Put<uint32_t>(&out, version_);
    Put<uint64_t>(&out, tensor_count_override != UINT64_MAX ? tensor_count_override : n_tensors_);
    Put<uint64_t>(&out, n_kv_);
    out += kv_;
    out += infos_;
    out.resize((out.size() + alignment_ - 1) / alignment_ * alignment_, '\0');
    out += data_;
    return out;
  }

 private:
  template <typename T>
  static void Put(std::string* s, T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s->append(b, sizeof(T));
  }
  static void PutString(std::string* s, const std::string& v) {
    Put<uint64_t>(s, v.size());
    *s += v;
  }
  void Kv(const std::string& key, uint32_t type, const void* v, size_t n) {
    ++n_kv_;
    PutString(&kv_, key);
    Put<uint32_t>(&kv_, type);
    kv_.append(static_cast<const char*>(v), n);
  }

  uint32_t version_;
  size_t alignment_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
  std::string kv_, infos_, data_;
};

}  // namespace kiln::testing
