#ifndef KNAPFORMER_SERVER_FAIR_QUEUE_H_
#define KNAPFORMER_SERVER_FAIR_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace knapformer {

// Tasks queued by job and taken round-robin between the jobs that have any
// (in order within a job), so that a job with many steps waiting for a
// solver delays another job's step by at most one of its own per solver
// thread, not by all of them. Thread-safe.
class FairQueue {
 public:
  void Push(const std::string& job, std::function<void()> task);
  // The next task: the oldest of the first job after the one served last
  // (in the jobs' order, wrapping) that has any; empty when none waits.
  std::function<void()> Pop();
  int64_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::deque<std::function<void()>>> queues_ ABSL_GUARDED_BY(mu_);
  std::string served_last_ ABSL_GUARDED_BY(mu_);
  int64_t size_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_FAIR_QUEUE_H_
