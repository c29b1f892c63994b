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
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (Item& item : items_) {
    if (item.release) item.release();
  }
}

void DeadlineWatchdog::Watch(Poll poll, std::function<void()> release, absl::Time deadline,
                             std::string what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back({std::move(poll), std::move(release), deadline, std::move(what)});
  }
  wake_.notify_all();
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
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, absl::ToChronoNanoseconds(sleep), [this] { return failed_; });
  }
}

void DeadlineWatchdog::Fail(const absl::Status& failure) {
  if (failure.ok()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) {
      failed_ = true;
      failure_ = failure;
    }
  }
  wake_.notify_all();
  const absl::Status first = this->failure();
  std::call_once(on_failure_once_, [&] {
    if (hooks_.on_failure) hooks_.on_failure(first);
  });
}

absl::Status DeadlineWatchdog::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

size_t DeadlineWatchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size() + polling_;
}

void DeadlineWatchdog::Loop() {
  if (hooks_.thread_init) hooks_.thread_init();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (items_.empty() || failed_) {
      wake_.wait(lock, [this] { return stopping_ || (!items_.empty() && !failed_); });
      continue;
    }
    // Work completes in order on one stream: the oldest item decides.
    Item item = std::move(items_.front());
    items_.pop_front();
    polling_ = 1;
    lock.unlock();
    bool done = false;
    absl::Status status = Check(item, &done);
    if (done || !status.ok()) {
      if (item.release) item.release();
      Fail(status);  // ignores Ok
      lock.lock();
      polling_ = 0;
      continue;
    }
    lock.lock();
    polling_ = 0;
    items_.push_front(std::move(item));
    wake_.wait_for(lock, absl::ToChronoNanoseconds(poll_interval_), [this] { return stopping_; });
  }
}

}  // namespace knapformer
