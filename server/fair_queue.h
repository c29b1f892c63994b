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

// Tasks queued by tenant and job, taken round-robin between the tenants that
// have any, round-robin between a tenant's jobs within its turn, and in order
// within a job: a tenant with many steps waiting for a solver, under however
// many job ids, delays another tenant's step by at most one of its own per
// solver thread. Thread-safe.
class FairQueue {
 public:
  void Push(const std::string& tenant, const std::string& job, std::function<void()> task);
  // The next task: of the first tenant after the one served last (in the
  // tenants' order, wrapping) that has any, its first job after the one it
  // was last served (wrapping; while it has tasks), that job's oldest;
  // empty when none waits.
  std::function<void()> Pop();
  int64_t size() const;

 private:
  struct TenantQueue {
    std::map<std::string, std::deque<std::function<void()>>> jobs;
    std::string served_last;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, TenantQueue> tenants_ ABSL_GUARDED_BY(mu_);
  std::string served_last_ ABSL_GUARDED_BY(mu_);
  int64_t size_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_FAIR_QUEUE_H_
