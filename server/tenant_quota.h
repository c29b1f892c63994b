#ifndef KNAPFORMER_SERVER_TENANT_QUOTA_H_
#define KNAPFORMER_SERVER_TENANT_QUOTA_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace knapformer {

// An amount (calls in flight, bytes of requests) that the tenants and their
// jobs hold at once (a tenant: the scope of a caller's credential,
// job_auth.h), under a limit in all, one per tenant and one per job, so that
// one tenant's jobs, however many ids it uses, hold at most the tenant's
// share. And each tenant keeps a reserve: a tenant holding more than
// `reserve` may not take the last `reserve` of the limit, which stays for
// tenants holding less (a tenant arriving at a busy server still gets its
// first calls in). Thread-safe.
class TenantQuota {
 public:
  struct Limits {
    int64_t total = 0;
    int64_t per_tenant = 0;
    int64_t per_job = 0;
    int64_t reserve = 0;
  };
  // `name` and `unit` word the refusals: "<name>...: ... <unit> ...", where
  // `name` is the flag-less limit ("max_plan_group_calls").
  TenantQuota(std::string name, std::string unit, Limits limits);

  // Takes `amount` for `job` of `tenant`, or nothing and RESOURCE_EXHAUSTED
  // naming the limit it would pass (the job's, the tenant's, all tenants',
  // or the reserve kept for others).
  absl::Status Take(const std::string& tenant, const std::string& job, int64_t amount);
  // Gives back what Take took.
  void Give(const std::string& tenant, const std::string& job, int64_t amount);

  int64_t held() const;
  int64_t held_by_tenant(const std::string& tenant) const;
  int64_t held_by_job(const std::string& job) const;
  const Limits& limits() const { return limits_; }

 private:
  const std::string name_;
  const std::string unit_;
  const Limits limits_;
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> by_tenant_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> by_job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_TENANT_QUOTA_H_
