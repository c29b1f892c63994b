#include "server/tenant_quota.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace knapformer {
namespace {

int64_t HeldIn(const std::map<std::string, int64_t>& held, const std::string& key) {
  auto it = held.find(key);
  return it == held.end() ? 0 : it->second;
}

void Subtract(std::map<std::string, int64_t>& held, const std::string& key, int64_t amount) {
  auto it = held.find(key);
  if (it != held.end() && (it->second -= amount) <= 0) held.erase(it);
}

}  // namespace

TenantQuota::TenantQuota(std::string name, std::string unit, Limits limits)
    : name_(std::move(name)), unit_(std::move(unit)), limits_(limits) {}

absl::Status TenantQuota::Take(const std::string& tenant, const std::string& job,
                               int64_t amount) {
  absl::MutexLock lock(&mu_);
  const int64_t job_held = HeldIn(by_job_, job);
  const int64_t tenant_held = HeldIn(by_tenant_, tenant);
  if (job_held + amount > limits_.per_job) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, "_per_job: job '", job, "' holds ", job_held, " ", unit_, ", and ",
                     amount, " more would pass its limit of ", limits_.per_job, "; retry later"));
  }
  if (tenant_held + amount > limits_.per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, "_per_tenant: tenant '", tenant, "' (its jobs together) holds ", tenant_held, " ",
        unit_, ", and ", amount, " more would pass its limit of ", limits_.per_tenant,
        "; retry later"));
  }
  if (held_ + amount > limits_.total) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, ": all tenants hold ", held_, " ", unit_, ", and ", amount,
                     " more would pass the server's limit of ", limits_.total, "; retry later"));
  }
  if (tenant_held + amount > limits_.reserve && held_ + amount > limits_.total - limits_.reserve) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, ": all tenants hold ", held_, " ", unit_, "; tenant '", tenant, "' would hold ",
        tenant_held + amount, ", past its reserve of ", limits_.reserve, ", and the last ",
        limits_.reserve, " of the server's ", limits_.total,
        " stay for tenants holding less; retry later"));
  }
  held_ += amount;
  by_tenant_[tenant] = tenant_held + amount;
  by_job_[job] = job_held + amount;
  return absl::OkStatus();
}

void TenantQuota::Give(const std::string& tenant, const std::string& job, int64_t amount) {
  absl::MutexLock lock(&mu_);
  held_ -= amount;
  Subtract(by_tenant_, tenant, amount);
  Subtract(by_job_, job, amount);
}

int64_t TenantQuota::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

int64_t TenantQuota::held_by_tenant(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  return HeldIn(by_tenant_, tenant);
}

int64_t TenantQuota::held_by_job(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  return HeldIn(by_job_, job);
}

}  // namespace knapformer
