// Status helpers shared by the engine and the backends.
//
// KILN_RETURN_IF_ERROR(expr) << "while ..." returns early with `expr`'s status,
// appending context (joined to the message as "<message>; <context>");
// KILN_ASSIGN_OR_RETURN(lhs, expr) unwraps a StatusOr (no context: for that,
// test the StatusOr and return StatusBuilder(s.status()) << "...").
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

// Accumulates context for a failing status. Cheap when unused; converts to
// absl::Status and absl::StatusOr<T> implicitly so it can be returned.
class StatusBuilder {
 public:
  explicit StatusBuilder(absl::Status status) : status_(std::move(status)) {}

  template <typename T>
  StatusBuilder& operator<<(const T& value) {
    if (!context_) context_ = std::make_unique<std::ostringstream>();
    *context_ << value;
    return *this;
  }

  operator absl::Status() const { return Build(); }  // NOLINT: implicit by design
  template <typename T>
  operator absl::StatusOr<T>() const {  // NOLINT: implicit by design
    return absl::StatusOr<T>(Build());
  }

  // The context is appended to the message; payloads (a device fault's
  // device, backend::FaultedDevice) travel with it.
  absl::Status Build() const {
    if (!context_ || context_->tellp() == 0) return status_;
    absl::Status out(status_.code(), std::string(status_.message()) + "; " + context_->str());
    status_.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
      out.SetPayload(url, payload);
    });
    return out;
  }

 private:
  absl::Status status_;
  std::unique_ptr<std::ostringstream> context_;
};

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// A for statement (not if/else) so `if (c) KILN_RETURN_IF_ERROR(x);` has no
// dangling else; the body returns on the first iteration.
#define KILN_RETURN_IF_ERROR(expr)                                     \
  for (::absl::Status _kiln_status = (expr); !_kiln_status.ok();)      \
  return ::kiln::StatusBuilder(std::move(_kiln_status))

#define KILN_ASSIGN_OR_RETURN(lhs, rexpr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(_kiln_statusor_, __LINE__), lhs, rexpr)

#define KILN_ASSIGN_OR_RETURN_IMPL(var, lhs, rexpr) \
  auto var = (rexpr);                               \
  if (!var.ok()) return ::kiln::StatusBuilder(std::move(var).status()); \
  lhs = std::move(var).value()
