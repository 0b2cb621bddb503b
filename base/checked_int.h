// CheckedInt: exact int64 arithmetic for sizes computed from untrusted numbers
// (graph attributes, dims, byte counts), the one place Kiln checks them.
//
// Every operation is defined for every input: a step whose exact result does not
// fit in int64 (or a division by zero) poisons the value, and every later step
// keeps it poisoned, so a whole formula is written as arithmetic and checked
// once at the end:
//
//   const CheckedInt eff = CheckedInt(dilation) * (k - 1) + 1;
//   if (!eff.ok()) return Error(...);
//
// Only the operands must be plain int64 values that are themselves exact (an
// unchecked `a + b` passed in defeats the point). Immutable value type; thread
// safe as any int.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

namespace kiln {

inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

class CheckedInt {
 public:
  constexpr CheckedInt(int64_t v) : value_(v) {}  // NOLINT: implicit, so formulas read as math

  constexpr bool ok() const { return ok_; }
  // The exact result; nullopt where some step overflowed.
  constexpr std::optional<int64_t> value() const {
    return ok_ ? std::optional<int64_t>(value_) : std::nullopt;
  }
  // REQUIRES: ok().
  constexpr int64_t get() const { return value_; }

  // Each operator computes `r` before passing it: in `Make(r, <computes r>)`
  // the order of argument evaluation is unspecified (clang reads `r` first).
  friend constexpr CheckedInt operator+(CheckedInt a, CheckedInt b) {
    int64_t r = 0;
    const bool ok = a.ok_ && b.ok_ && !__builtin_add_overflow(a.value_, b.value_, &r);
    return Make(r, ok);
  }
  friend constexpr CheckedInt operator-(CheckedInt a, CheckedInt b) {
    int64_t r = 0;
    const bool ok = a.ok_ && b.ok_ && !__builtin_sub_overflow(a.value_, b.value_, &r);
    return Make(r, ok);
  }
  friend constexpr CheckedInt operator*(CheckedInt a, CheckedInt b) {
    int64_t r = 0;
    const bool ok = a.ok_ && b.ok_ && !__builtin_mul_overflow(a.value_, b.value_, &r);
    return Make(r, ok);
  }
  // Truncating, as C++; poisoned for b == 0 and for INT64_MIN / -1.
  friend constexpr CheckedInt operator/(CheckedInt a, CheckedInt b) {
    const bool ok = a.ok_ && b.ok_ && b.value_ != 0 &&
                    !(a.value_ == std::numeric_limits<int64_t>::min() && b.value_ == -1);
    return Make(ok ? a.value_ / b.value_ : 0, ok);
  }

 private:
  static constexpr CheckedInt Make(int64_t v, bool ok) {
    CheckedInt r(v);
    r.ok_ = ok;
    return r;
  }

  int64_t value_;
  bool ok_ = true;
};

}  // namespace kiln
