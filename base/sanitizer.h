// Whether this translation unit is built with AddressSanitizer (make test-asan).
//
// Under ASan the process's allocator is ASan's: freed blocks wait in a
// quarantine (256 MiB by default) before reuse, so resident memory grows with
// every free and "RSS stays flat" checks mean nothing there (LeakSanitizer
// reports real leaks at exit instead), and glibc's mallopt tuning does not
// apply (ASan's mallopt does nothing and returns 0).
#pragma once

namespace kiln {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

}  // namespace kiln
