// ThreadSanitizer annotations for Debian's uninstrumented Abseil (KILN_TSAN).
//
// libabsl_synchronization is compiled without -fsanitize=thread, so its
// ABSL_TSAN_MUTEX_* annotations are compiled out and TSan sees no
// happens-before edge through absl::Mutex: every field an absl::Mutex guards
// would be reported as a race. This shared library, linked first into every
// binary of a TSan build, interposes the exported Mutex, CondVar, Notification
// and BlockingCounter entry points (by their mangled names; Debian's inline
// namespace is `debian3`), forwards each to the real one (dlsym RTLD_NEXT), and
// tells TSan what it did with the __tsan_mutex_* interface, as Abseil's own
// annotations would. Accesses inside the real calls (Condition functions that
// absl evaluates while it holds the lock) are ignored between pre_ and post_.
// The *WithTimeout variants are left alone: in this build they tail-call the
// *WithDeadline ones through the PLT, which are annotated (annotating both
// counted one lock twice).
//
// What stays invisible: inline fast paths that touch absl's atomics without a
// call (Notification::HasBeenNotified), and synchronization inside other
// uninstrumented libraries that does not go through these entry points.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

template <typename F>
F Real(const char* symbol) {
  void* p = ::dlsym(RTLD_NEXT, symbol);
  if (p == nullptr) {
    std::fprintf(stderr, "absl_tsan_annotations: %s not found\n", symbol);
    std::abort();
  }
  return reinterpret_cast<F>(p);
}

constexpr unsigned kRead = __tsan_mutex_read_lock;

// Abseil's own deadlock detector (on in Debian's build) keeps one lock graph
// for the process, guarded by an internal SpinLock that TSan cannot see: two
// threads destroying mutexes at once (~Mutex removes the mutex's node) were
// reported as a race inside GraphCycles::RemoveNode (kiln_tsan_server_test,
// 2026-12-07). TSan finds lock-order inversions itself from the annotations
// below, so TSan builds turn Abseil's detector off before main: with kIgnore,
// neither Lock nor ~Mutex touches the graph.
__attribute__((constructor)) void KilnTsanAbslDeadlockDetectionOff() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace

// One interposer: `name` is the C++ symbol, the body sees `real` (the library's).
#define KILN_INTERPOSE(ret, mangled, params, args, body)                      \
  extern "C" ret mangled params;                                               \
  extern "C" __attribute__((visibility("default"))) ret mangled params {      \
    static const auto real = Real<ret(*) params>(#mangled);                    \
    body                                                                       \
  }

using absl::Condition;
using absl::Duration;
using absl::Mutex;
using absl::Time;

// Mutex: exclusive.
KILN_INTERPOSE(void, _ZN4absl7debian35Mutex4LockEv, (Mutex * mu), (mu), {
  __tsan_mutex_pre_lock(mu, 0);
  real(mu);
  __tsan_mutex_post_lock(mu, 0, 0);
})
KILN_INTERPOSE(void, _ZN4absl7debian35Mutex6UnlockEv, (Mutex * mu), (mu), {
  __tsan_mutex_pre_unlock(mu, 0);
  real(mu);
  __tsan_mutex_post_unlock(mu, 0);
})
KILN_INTERPOSE(bool, _ZN4absl7debian35Mutex7TryLockEv, (Mutex * mu), (mu), {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_lock);
  const bool locked = real(mu);
  __tsan_mutex_post_lock(
      mu, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
})
KILN_INTERPOSE(void, _ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE,
               (Mutex * mu, const Condition& c), (mu, c), {
  __tsan_mutex_pre_lock(mu, 0);
  real(mu, c);
  __tsan_mutex_post_lock(mu, 0, 0);
})
KILN_INTERPOSE(bool, _ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE,
               (Mutex * mu, const Condition& c, Time t), (mu, c, t), {
  __tsan_mutex_pre_lock(mu, 0);
  const bool met = real(mu, c, t);
  __tsan_mutex_post_lock(mu, 0, 0);
  return met;
})

// Mutex: shared.
KILN_INTERPOSE(void, _ZN4absl7debian35Mutex10ReaderLockEv, (Mutex * mu), (mu), {
  __tsan_mutex_pre_lock(mu, kRead);
  real(mu);
  __tsan_mutex_post_lock(mu, kRead, 0);
})
KILN_INTERPOSE(void, _ZN4absl7debian35Mutex12ReaderUnlockEv, (Mutex * mu), (mu), {
  __tsan_mutex_pre_unlock(mu, kRead);
  real(mu);
  __tsan_mutex_post_unlock(mu, kRead);
})
KILN_INTERPOSE(bool, _ZN4absl7debian35Mutex13ReaderTryLockEv, (Mutex * mu), (mu), {
  __tsan_mutex_pre_lock(mu, kRead | __tsan_mutex_try_lock);
  const bool locked = real(mu);
  __tsan_mutex_post_lock(
      mu, kRead | __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
})
KILN_INTERPOSE(void, _ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE,
               (Mutex * mu, const Condition& c), (mu, c), {
  __tsan_mutex_pre_lock(mu, kRead);
  real(mu, c);
  __tsan_mutex_post_lock(mu, kRead, 0);
})

// Await and CondVar waits give the lock up and take it again inside the call.
#define KILN_RELEASE_THEN_WAIT(mu) \
  __tsan_mutex_pre_unlock(mu, 0);  \
  __tsan_mutex_post_unlock(mu, 0); \
  __tsan_mutex_pre_lock(mu, 0)
#define KILN_WOKEN(mu) __tsan_mutex_post_lock(mu, 0, 0)

KILN_INTERPOSE(void, _ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE,
               (Mutex * mu, const Condition& c), (mu, c), {
  KILN_RELEASE_THEN_WAIT(mu);
  real(mu, c);
  KILN_WOKEN(mu);
})
KILN_INTERPOSE(bool, _ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE,
               (Mutex * mu, const Condition& c, Time t), (mu, c, t), {
  KILN_RELEASE_THEN_WAIT(mu);
  const bool met = real(mu, c, t);
  KILN_WOKEN(mu);
  return met;
})
KILN_INTERPOSE(void, _ZN4absl7debian37CondVar4WaitEPNS0_5MutexE,
               (absl::CondVar * cv, Mutex* mu), (cv, mu), {
  KILN_RELEASE_THEN_WAIT(mu);
  real(cv, mu);
  KILN_WOKEN(mu);
})
KILN_INTERPOSE(bool, _ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE,
               (absl::CondVar * cv, Mutex* mu, Time t), (cv, mu, t), {
  KILN_RELEASE_THEN_WAIT(mu);
  const bool timed_out = real(cv, mu, t);
  KILN_WOKEN(mu);
  return timed_out;
})

// A destroyed Mutex's address may hold a new one.
KILN_INTERPOSE(void, _ZN4absl7debian35MutexD2Ev, (Mutex * mu), (mu), {
  __tsan_mutex_destroy(mu, 0);
  real(mu);
})
KILN_INTERPOSE(void, _ZN4absl7debian35MutexD1Ev, (Mutex * mu), (mu), {
  __tsan_mutex_destroy(mu, 0);
  real(mu);
})

// Notification and BlockingCounter publish with an atomic store that waiters
// may read without taking the internal mutex.
KILN_INTERPOSE(void, _ZN4absl7debian312Notification6NotifyEv, (absl::Notification * n), (n), {
  __tsan_release(n);
  real(n);
})
KILN_INTERPOSE(void, _ZNK4absl7debian312Notification19WaitForNotificationEv,
               (const absl::Notification* n), (n), {
  real(n);
  __tsan_acquire(const_cast<absl::Notification*>(n));
})
KILN_INTERPOSE(bool,
               _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE,
               (const absl::Notification* n, Duration d), (n, d), {
  const bool notified = real(n, d);
  if (notified) __tsan_acquire(const_cast<absl::Notification*>(n));
  return notified;
})
KILN_INTERPOSE(bool,
               _ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE,
               (const absl::Notification* n, Time t), (n, t), {
  const bool notified = real(n, t);
  if (notified) __tsan_acquire(const_cast<absl::Notification*>(n));
  return notified;
})
KILN_INTERPOSE(bool, _ZN4absl7debian315BlockingCounter14DecrementCountEv,
               (absl::BlockingCounter * b), (b), {
  __tsan_release(b);
  return real(b);
})
KILN_INTERPOSE(void, _ZN4absl7debian315BlockingCounter4WaitEv, (absl::BlockingCounter * b), (b), {
  real(b);
  __tsan_acquire(b);
})
