#ifndef KNAPFORMER_SERVER_THREAD_POOL_H_
#define KNAPFORMER_SERVER_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knapformer {

// A fixed set of threads running queued tasks in FIFO order. The planner
// solves on it so that gRPC's callback threads never run a solve or a
// thousand-rank fan-out. The destructor runs every queued task (timed ones
// at once), then joins.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> task);
  // Runs `task` once `when` has passed (on a pool thread; no thread sleeps
  // meanwhile). Tasks due at the same time run in the order scheduled.
  void ScheduleAt(absl::Time when, std::function<void()> task);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Work();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, std::function<void()>> timed_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_THREAD_POOL_H_
