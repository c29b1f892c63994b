#include "server/job_quota.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace knapformer {

JobQuota::JobQuota(std::string name, std::string unit, int64_t limit, int64_t per_job_limit)
    : name_(std::move(name)),
      unit_(std::move(unit)),
      limit_(limit),
      per_job_limit_(per_job_limit) {}

absl::Status JobQuota::Take(const std::string& job, int64_t amount) {
  absl::MutexLock lock(&mu_);
  auto it = held_by_job_.find(job);
  const int64_t mine = it == held_by_job_.end() ? 0 : it->second;
  if (mine + amount > per_job_limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, "_per_job: this job holds ", mine, " ", unit_, ", and ", amount,
                     " more would pass its limit of ", per_job_limit_, "; retry later"));
  }
  if (held_ + amount > limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, ": all jobs hold ", held_, " ", unit_, ", and ", amount,
                     " more would pass the server's limit of ", limit_, "; retry later"));
  }
  held_ += amount;
  held_by_job_[job] = mine + amount;
  return absl::OkStatus();
}

void JobQuota::Give(const std::string& job, int64_t amount) {
  absl::MutexLock lock(&mu_);
  held_ -= amount;
  auto it = held_by_job_.find(job);
  if (it != held_by_job_.end() && (it->second -= amount) <= 0) held_by_job_.erase(it);
}

int64_t JobQuota::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

int64_t JobQuota::held_by(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = held_by_job_.find(job);
  return it == held_by_job_.end() ? 0 : it->second;
}

}  // namespace knapformer
