#include "transport/deadline_watchdog.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace knapformer {

DeadlineWatchdog::DeadlineWatchdog(Hooks hooks, absl::Duration poll_interval)
    : hooks_(std::move(hooks)), poll_interval_(poll_interval) {
  thread_ = std::thread([this] { Loop(); });
}

DeadlineWatchdog::~DeadlineWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  std::deque<Item> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(items_);
  }
  for (Item& item : left) {
    if (item.release) item.release();
  }
}

void DeadlineWatchdog::Watch(Poll poll, std::function<void()> release, absl::Time deadline,
                             std::string what) {
  absl::MutexLock lock(&mu_);
  items_.push_back({std::move(poll), std::move(release), deadline, std::move(what)});
}

absl::Status DeadlineWatchdog::Check(const Item& item, bool* done) const {
  *done = false;
  absl::StatusOr<bool> completed = item.poll();
  if (!completed.ok()) return completed.status();
  if (*completed) {
    *done = true;
    return absl::OkStatus();
  }
  if (hooks_.poll_error) {
    absl::Status error = hooks_.poll_error();
    if (!error.ok()) return error;
  }
  if (absl::Now() >= item.deadline) {
    return absl::UnavailableError(absl::StrCat(
        item.what, ": not done within the transport's timeout; a peer is gone or stalled"));
  }
  return absl::OkStatus();
}

absl::Status DeadlineWatchdog::Wait(const Poll& poll, absl::Time deadline,
                                    const std::string& what) {
  const Item item{poll, nullptr, deadline, what};
  for (absl::Duration sleep = absl::Microseconds(10);; sleep = std::min(2 * sleep, poll_interval_)) {
    absl::Status failed = failure();
    if (!failed.ok()) return failed;
    bool done = false;
    absl::Status status = Check(item, &done);
    if (!status.ok()) {
      Fail(status);
      return failure();
    }
    if (done) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&failed_), sleep);
  }
}

void DeadlineWatchdog::Fail(const absl::Status& failure) {
  if (failure.ok()) return;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_) {
      failed_ = true;
      failure_ = failure;
    }
  }
  const absl::Status first = this->failure();
  std::call_once(on_failure_once_, [&] {
    if (hooks_.on_failure) hooks_.on_failure(first);
  });
}

absl::Status DeadlineWatchdog::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

size_t DeadlineWatchdog::pending() const {
  absl::MutexLock lock(&mu_);
  return items_.size() + polling_;
}

void DeadlineWatchdog::Loop() {
  if (hooks_.thread_init) hooks_.thread_init();
  const auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (!items_.empty() && !failed_);
  };
  mu_.Lock();
  while (!stopping_) {
    if (items_.empty() || failed_) {
      mu_.Await(absl::Condition(&has_work));
      continue;
    }
    // Work completes in order on one stream: the oldest item decides.
    Item item = std::move(items_.front());
    items_.pop_front();
    polling_ = 1;
    mu_.Unlock();
    bool done = false;
    absl::Status status = Check(item, &done);
    if (done || !status.ok()) {
      if (item.release) item.release();
      Fail(status);  // ignores Ok
      mu_.Lock();
      polling_ = 0;
      continue;
    }
    mu_.Lock();
    polling_ = 0;
    items_.push_front(std::move(item));
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), poll_interval_);
  }
  mu_.Unlock();
}

}  // namespace knapformer
