#include "server/thread_pool.h"

#include <utility>

namespace knapformer {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void ThreadPool::ScheduleAt(absl::Time when, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  timed_.emplace(when, std::move(task));
}

void ThreadPool::Work() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty() ||
               (!timed_.empty() && timed_.begin()->first <= absl::Now());
      };
      while (!ready()) {
        const absl::Time next =
            timed_.empty() ? absl::InfiniteFuture() : timed_.begin()->first;
        // Wakes for new work, for a timed task due sooner than `next`, or
        // when `next` passes.
        auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return ready() || (!timed_.empty() && timed_.begin()->first < next);
        };
        mu_.AwaitWithDeadline(absl::Condition(&wake), next);
      }
      // Due timed tasks (all of them once stopping) join the queue in time order.
      while (!timed_.empty() && (stopping_ || timed_.begin()->first <= absl::Now())) {
        queue_.push_back(std::move(timed_.begin()->second));
        timed_.erase(timed_.begin());
      }
      if (queue_.empty()) return;  // stopping, and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace knapformer
