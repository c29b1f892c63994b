#ifndef KNAPFORMER_TRANSPORT_DEADLINE_WATCHDOG_H_
#define KNAPFORMER_TRANSPORT_DEADLINE_WATCHDOG_H_

// Deadlines for work that completes asynchronously (collectives enqueued on
// a GPU stream), with no CUDA in it so that CPU tests run it. NCCL kernels
// whose peer is gone never finish and never report an error: only aborting
// the communicator stops them. The watchdog polls every watched piece of
// work on a thread of its own and, the first time one misses its deadline
// or the error poll reports something, records that failure and calls
// `on_failure` once (the transport aborts its communicator there). Host
// waits (Wait) poll the same way instead of blocking in the driver, so no
// wait of the transport is unbounded.

#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knapformer {

class DeadlineWatchdog {
 public:
  // True once the work has completed, false while it runs, an error if
  // polling itself failed (which is a failure of the work).
  using Poll = std::function<absl::StatusOr<bool>()>;

  struct Hooks {
    // Runs first on the watchdog's thread (e.g. cudaSetDevice).
    std::function<void()> thread_init;
    // An asynchronous error of the whole group (ncclCommGetAsyncError), or
    // Ok; polled with the work. May be empty.
    std::function<absl::Status()> poll_error;
    // Called once, with the first failure, on whichever thread found it.
    std::function<void(const absl::Status&)> on_failure;
  };

  DeadlineWatchdog(Hooks hooks, absl::Duration poll_interval);
  // Stops the thread; work still watched is released, not waited for.
  ~DeadlineWatchdog();
  DeadlineWatchdog(const DeadlineWatchdog&) = delete;
  DeadlineWatchdog& operator=(const DeadlineWatchdog&) = delete;

  // Watches `poll` in the background until it completes or `deadline`
  // passes; `release` (may be empty) runs once it is retired either way.
  void Watch(Poll poll, std::function<void()> release, absl::Time deadline, std::string what);

  // Blocks the caller until `poll` completes (Ok), or fails, or `deadline`
  // passes (DeadlineExceeded), or the watchdog has failed (that failure).
  absl::Status Wait(const Poll& poll, absl::Time deadline, const std::string& what);

  // Records `failure` (unless one is already recorded) and calls
  // on_failure, once in the watchdog's life. Ignores Ok.
  void Fail(const absl::Status& failure);

  // The first failure; Ok while there is none.
  absl::Status failure() const;

  // Work watched and not yet retired (released). The item being polled
  // counts: it is retired only after its release has run.
  size_t pending() const;

 private:
  struct Item {
    Poll poll;
    std::function<void()> release;
    absl::Time deadline;
    std::string what;
  };

  void Loop();
  // Ok, or the failure that this poll of `item` found.
  absl::Status Check(const Item& item, bool* done) const;

  const Hooks hooks_;
  const absl::Duration poll_interval_;
  // Waiters wait on conditions of these (absl::Mutex::Await), which the
  // mutex re-evaluates as it is released: no condition variable to notify.
  mutable absl::Mutex mu_;
  std::deque<Item> items_ ABSL_GUARDED_BY(mu_);
  // 1 while the loop polls an item outside the lock.
  size_t polling_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::once_flag on_failure_once_;
  std::thread thread_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_DEADLINE_WATCHDOG_H_
