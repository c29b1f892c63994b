#include "server/fair_queue.h"

#include <utility>

namespace knapformer {

void FairQueue::Push(const std::string& job, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queues_[job].push_back(std::move(task));
  ++size_;
}

std::function<void()> FairQueue::Pop() {
  absl::MutexLock lock(&mu_);
  if (queues_.empty()) return nullptr;
  // Only jobs with tasks are kept, so the next one after served_last_ (or
  // the first, wrapping) has one.
  auto next = queues_.upper_bound(served_last_);
  if (next == queues_.end()) next = queues_.begin();
  std::function<void()> task = std::move(next->second.front());
  next->second.pop_front();
  served_last_ = next->first;
  if (next->second.empty()) queues_.erase(next);
  --size_;
  return task;
}

int64_t FairQueue::size() const {
  absl::MutexLock lock(&mu_);
  return size_;
}

}  // namespace knapformer
