#ifndef KNAPFORMER_SERVER_JOB_QUOTA_H_
#define KNAPFORMER_SERVER_JOB_QUOTA_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace knapformer {

// An amount (calls in flight, bytes of requests) that the jobs hold at once,
// under a limit in all and one per job: a job that floods the server holds
// at most its share, and the others still get theirs. Thread-safe.
class JobQuota {
 public:
  // `name` and `unit` word the refusals: "<name>: ... <unit> ...", where
  // `name` is the flag-less limit ("max_plan_group_calls").
  JobQuota(std::string name, std::string unit, int64_t limit, int64_t per_job_limit);

  // Takes `amount` for `job`, or nothing and RESOURCE_EXHAUSTED naming the
  // limit it would pass (the job's, or all jobs').
  absl::Status Take(const std::string& job, int64_t amount);
  // Gives back what Take took.
  void Give(const std::string& job, int64_t amount);

  int64_t held() const;
  int64_t held_by(const std::string& job) const;

 private:
  const std::string name_;
  const std::string unit_;
  const int64_t limit_;
  const int64_t per_job_limit_;
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> held_by_job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_JOB_QUOTA_H_
