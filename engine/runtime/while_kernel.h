// While with a data-dependent trip count: the engine's kernel for a While step
// on a host-memory device (the CPU, which claims the op for this kernel).
//
// The compile pipeline compiles the node's cond and body as programs of their
// own (LirKernel.subprograms; inputs named c0 .. cN-1 after the carries). A
// launch copies the carries in, then per iteration runs cond (one bool
// scalar) and, while it is true, body (new carries), and writes the final
// carries out. Between iterations the run's cancellation and deadline are
// honoured, and after `max_iterations` body runs with cond still true the
// launch fails RESOURCE_EXHAUSTED naming the node.
//
// Thread safety: like any Kernel, one launch at a time; BindRun before each
// launch (the executor does). The cond and body programs are shared and
// thread-safe.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "backends/backend.h"
#include "engine/engine.h"

namespace kiln::runtime {

class Program;

class WhileKernel final : public backend::Kernel {
 public:
  // `label` names the node in errors; `limit_source` says where
  // `max_iterations` came from ("limits.max_while_iterations = 7").
  WhileKernel(std::string label, backend::KernelSpec spec, std::shared_ptr<Program> cond,
              std::shared_ptr<Program> body, int64_t max_iterations, std::string limit_source);

  std::string implementation() const override { return "engine:while"; }
  // The options of the run the next Launch belongs to (valid for it); null =
  // no deadline, never cancelled.
  void BindRun(const RunOptions* options) { run_ = options; }
  absl::Status Launch(backend::Stream& stream, std::span<const backend::BufferView> inputs,
                      std::span<const backend::BufferView> outputs) override;

 private:
  const std::string label_;
  const backend::KernelSpec spec_;
  const std::shared_ptr<Program> cond_;
  const std::shared_ptr<Program> body_;
  const int64_t max_iterations_;
  const std::string limit_source_;
  const RunOptions* run_ = nullptr;
};

}  // namespace kiln::runtime
