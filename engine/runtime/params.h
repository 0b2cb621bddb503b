// ParamSetImpl: named parameter tensors resident in device memory. Values are
// uploaded to the CPU at creation and mirrored to another device the first
// time an executable there reads them.
//
// Thread safety: thread-safe; mirrors are created under mirrors_mu_.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "engine/engine.h"

namespace kiln::runtime {

class ParamSetImpl final : public ParamSet {
 public:
  struct Entry {
    DType dtype;
    Dims dims;
    int64_t bytes;
  };

  static absl::StatusOr<std::shared_ptr<ParamSetImpl>> Create(backend::Device& home,
                                                              std::span<const TensorRef> values);

  int64_t total_bytes() const override { return total_bytes_; }
  std::vector<std::string> names() const override;
  absl::StatusOr<HostTensor> Read(const std::string& name) const override;

  const Entry* Find(const std::string& name) const;
  // The parameter's bytes on `device`, copying it there on first use.
  absl::StatusOr<backend::BufferView> On(const std::string& name, backend::Device& device) const;

 private:
  explicit ParamSetImpl(backend::Device& home) : home_(home) {}

  backend::Device& home_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::unique_ptr<backend::Buffer>> home_buffers_;
  int64_t total_bytes_ = 0;

  mutable absl::Mutex mirrors_mu_;
  mutable std::map<std::pair<std::string, std::string>, std::unique_ptr<backend::Buffer>> mirrors_
      ABSL_GUARDED_BY(mirrors_mu_);  // (param, device id) -> buffer
};

}  // namespace kiln::runtime
