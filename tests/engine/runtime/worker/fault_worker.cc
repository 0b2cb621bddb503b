// kiln_fault_worker: the device worker with a test-only fault kernel, built
// only into the tests (DESIGN.md section 5, "Faults contained"). It serves
// its device as kiln-device-worker does, and also claims custom ops named
// "kiln.test.fault", whose payload says what launching one does:
//   crash  the worker dies of SIGSEGV          hang   Launch never returns
//   exit   the worker exits with status 3      lost   a device fault (device lost)
//   error  an ordinary INTERNAL error
// The kernel copies its input to its output otherwise (payload "pass").
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <thread>

#include "absl/time/clock.h"
#include "engine/runtime/worker_server.h"

namespace kiln {
namespace {

constexpr char kFaultOp[] = "kiln.test.fault";

bool IsFault(const backend::KernelSpec& spec) {
  return spec.op == v1::OP_CUSTOM && spec.attrs.custom().name() == kFaultOp;
}

class FaultKernel final : public backend::Kernel {
 public:
  FaultKernel(backend::Device& device, std::string mode) : device_(device), mode_(std::move(mode)) {}
  std::string implementation() const override { return "test:fault_" + mode_; }
  absl::Status Launch(backend::Stream& stream, std::span<const backend::BufferView> inputs,
                      std::span<const backend::BufferView> outputs) override {
    if (mode_ == "crash") {
      // The default action, not a sanitizer's handler: the worker dies of
      // the signal, as a driver crash kills it.
      std::signal(SIGSEGV, SIG_DFL);
      std::raise(SIGSEGV);
    }
    if (mode_ == "exit") _exit(3);
    if (mode_ == "hang") {
      for (;;) absl::SleepFor(absl::Hours(1));
    }
    if (mode_ == "lost") return backend::DeviceFault(device_.info().id, "the device was lost (fault kernel)");
    if (mode_ == "error") return absl::InternalError("the fault kernel failed on purpose");
    if (inputs.size() != 1 || outputs.size() != 1 || inputs[0].bytes != outputs[0].bytes) {
      return absl::InvalidArgumentError("the fault kernel's pass mode copies one input to one output");
    }
    return device_.CopyOnDevice(stream, inputs[0], outputs[0]);
  }

 private:
  backend::Device& device_;
  const std::string mode_;
};

// The real device, plus the fault kernel.
class FaultDevice final : public backend::Device {
 public:
  explicit FaultDevice(backend::Device& real) : real_(real) {}
  const backend::DeviceInfo& info() const override { return real_.info(); }
  absl::StatusOr<std::unique_ptr<backend::Buffer>> Allocate(int64_t bytes) override {
    return real_.Allocate(bytes);
  }
  absl::StatusOr<std::unique_ptr<backend::Stream>> CreateStream() override { return real_.CreateStream(); }
  absl::Status CopyToDevice(backend::Stream& s, const void* src, backend::BufferView dst) override {
    return real_.CopyToDevice(s, src, dst);
  }
  absl::Status CopyToHost(backend::Stream& s, backend::BufferView src, void* dst) override {
    return real_.CopyToHost(s, src, dst);
  }
  absl::Status CopyOnDevice(backend::Stream& s, backend::BufferView src, backend::BufferView dst) override {
    return real_.CopyOnDevice(s, src, dst);
  }
  backend::Claim Supports(const backend::KernelSpec& spec) const override {
    return IsFault(spec) ? backend::Claim::Yes() : real_.Supports(spec);
  }
  absl::StatusOr<std::unique_ptr<backend::Kernel>> PrepareKernel(const backend::KernelSpec& spec,
                                                                 backend::PrepareContext& c) override {
    if (!IsFault(spec)) return real_.PrepareKernel(spec, c);
    return std::unique_ptr<backend::Kernel>(new FaultKernel(real_, spec.attrs.custom().payload()));
  }
  int64_t memory_in_use() const override { return real_.memory_in_use(); }

 private:
  backend::Device& real_;
};

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  return kiln::runtime::worker::WorkerMain(argc, argv, [](kiln::backend::Device& real) {
    return std::unique_ptr<kiln::backend::Device>(new kiln::FaultDevice(real));
  });
}
