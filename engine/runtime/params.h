// ParamSetImpl: named parameter tensors resident in device memory. Values are
// uploaded to the CPU at creation and mirrored to another device the first
// time an executable there reads them.
//
// Thread safety: thread-safe; mirrors are created under mirrors_mu_.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/packing.h"
#include "engine/engine.h"

namespace kiln::runtime {

class ParamSetImpl final : public ParamSet {
 public:
  struct Entry {
    DType dtype;
    Dims dims;
    int64_t bytes;
  };

  // `keep_alive` owns `home` and every device a mirror may land on (the
  // device registry), so a parameter set may outlive the Engine.
  // A `training` set lives on `home` only (no mirrors): training steps
  // there write their new values into it (Program::Run, LIR param_updates).
  // `written` names the params runs write (a session's state); empty means
  // every one (a training step's). Only those are never packed.
  static absl::StatusOr<std::shared_ptr<ParamSetImpl>> Create(
      std::shared_ptr<const void> keep_alive, backend::Device& home,
      std::span<const TensorRef> values, bool training = false, std::set<std::string> written = {});

  int64_t total_bytes() const override { return total_bytes_; }
  std::vector<std::string> names() const override;
  absl::StatusOr<HostTensor> Read(const std::string& name) const override;
  bool training() const override { return training_; }
  // A training step's set (every param written), not a session's state set.
  bool training_step_set() const { return training_ && written_.empty(); }
  backend::Device& home() const { return home_; }
  // Held exclusively by a training step's run for its whole length (steps on
  // one set are serialized), shared by Read (which sees whole steps).
  absl::Mutex& step_mu() const { return step_mu_; }

  const Entry* Find(const std::string& name) const;

  // A training step's set (training_step_set()): its second buffer for
  // `name` on home. The step's kernels
  // write the param's new value there (Program::Run binds the LIR
  // param_update slot to it) while they read the current one, and
  // CommitSpare makes it current once the whole step succeeded (the old
  // buffer becomes the next step's spare). No copy per step, and a step that
  // fails part-way leaves every param as it was. Allocated on first use and
  // kept with the set; spare_bytes() counts them. The caller holds step_mu()
  // exclusively (a training step's run) for both calls and everything
  // between them.
  absl::StatusOr<backend::BufferView> Spare(const std::string& name) const;
  void CommitSpare(const std::string& name) const;
  int64_t spare_bytes() const { return spare_bytes_.load(std::memory_order_relaxed); }
  // The parameter's bytes on `device`, copying it there on first use.
  absl::StatusOr<backend::BufferView> On(const std::string& name, backend::Device& device) const;

  // The parameter on `device` packed by `pack` into the layout named `key`
  // (backends/packing.h), packed on first use and kept with the set until it
  // goes (a param set's values never change, so neither does the packing).
  // Null for a param a training set's runs rewrite (every one of a training
  // step's; a session's state params). Packed copies
  // are not counted in total_bytes(). Concurrent first uses pack once.
  using PackFn = absl::FunctionRef<absl::StatusOr<std::shared_ptr<const backend::PackedOperand>>(
      const backend::BufferView&)>;
  absl::StatusOr<std::shared_ptr<const backend::PackedOperand>> Packed(
      const std::string& name, backend::Device& device, const std::string& key,
      PackFn pack) const;

 private:
  ParamSetImpl(std::shared_ptr<const void> keep_alive, backend::Device& home)
      : keep_alive_(std::move(keep_alive)), home_(home) {}

  std::shared_ptr<const void> keep_alive_;  // first: destroyed after every buffer
  backend::Device& home_;
  bool training_ = false;
  std::set<std::string> written_;  // of a training set; empty = all
  mutable absl::Mutex step_mu_;
  std::map<std::string, Entry> entries_;
  // Its keys are fixed at Create; a training step swaps a value with its
  // spare_buffers_ entry (CommitSpare) under step_mu_ held exclusively, and
  // every reader of a written param holds step_mu_ (Read, a run).
  mutable std::map<std::string, std::unique_ptr<backend::Buffer>> home_buffers_;
  mutable std::map<std::string, std::unique_ptr<backend::Buffer>> spare_buffers_;  // step_mu_
  mutable std::atomic<int64_t> spare_bytes_{0};
  int64_t total_bytes_ = 0;

  mutable absl::Mutex mirrors_mu_;
  // (param, device id) -> the device generation it was made in, the buffer.
  mutable std::map<std::pair<std::string, std::string>,
                   std::pair<uint64_t, std::unique_ptr<backend::Buffer>>>
      mirrors_ ABSL_GUARDED_BY(mirrors_mu_);
  mutable std::vector<std::unique_ptr<backend::Buffer>> retired_ ABSL_GUARDED_BY(mirrors_mu_);

  mutable absl::Mutex packed_mu_;
  // "<device id>/<param>/<packing key>" -> the device generation it was made
  // in, the packed copy.
  mutable std::map<std::string,
                   std::pair<uint64_t, std::shared_ptr<const backend::PackedOperand>>>
      packed_ ABSL_GUARDED_BY(packed_mu_);
};

}  // namespace kiln::runtime
