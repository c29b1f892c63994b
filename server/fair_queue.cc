#include "server/fair_queue.h"

#include <utility>

namespace knapformer {
namespace {

// The first key after `last` (wrapping). REQUIRES: `map` is not empty.
template <typename Map>
typename Map::iterator NextAfter(Map& map, const std::string& last) {
  auto next = map.upper_bound(last);
  return next == map.end() ? map.begin() : next;
}

}  // namespace

void FairQueue::Push(const std::string& tenant, const std::string& job,
                     std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tenants_[tenant].jobs[job].push_back(std::move(task));
  ++size_;
}

std::function<void()> FairQueue::Pop() {
  absl::MutexLock lock(&mu_);
  if (tenants_.empty()) return nullptr;
  // Only tenants and jobs with tasks are kept, so the next ones have one.
  auto tenant = NextAfter(tenants_, served_last_);
  TenantQueue& queue = tenant->second;
  auto job = NextAfter(queue.jobs, queue.served_last);
  std::function<void()> task = std::move(job->second.front());
  job->second.pop_front();
  served_last_ = tenant->first;
  queue.served_last = job->first;
  if (job->second.empty()) queue.jobs.erase(job);
  if (queue.jobs.empty()) tenants_.erase(tenant);
  --size_;
  return task;
}

int64_t FairQueue::size() const {
  absl::MutexLock lock(&mu_);
  return size_;
}

}  // namespace knapformer
