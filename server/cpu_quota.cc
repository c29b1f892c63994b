#include "server/cpu_quota.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace knapformer {
namespace {

// The first line of `path`, or empty when it cannot be read.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return line;
}

// ceil(quota / period) for a positive quota and period, else empty.
std::optional<int> Cpus(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<int>(std::max<int64_t>(1, (quota + period - 1) / period));
}

std::optional<int> FromCpuMax(const std::string& path) {
  const std::vector<std::string> fields =
      absl::StrSplit(FirstLine(path), ' ', absl::SkipWhitespace());
  int64_t quota = 0, period = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period)) {
    return std::nullopt;  // "max PERIOD" (no quota), or unreadable
  }
  return Cpus(quota, period);
}

}  // namespace

std::optional<int> CgroupCpuQuota(const std::string& root, const std::string& cgroup_path) {
  // v2: the process's own cgroup, then the root (a container's namespace
  // shows its own cgroup there).
  std::string own = std::string(absl::StripSuffix(root, "/"));
  if (!cgroup_path.empty() && cgroup_path != "/") own += cgroup_path;
  for (const std::string& dir : {own, std::string(absl::StripSuffix(root, "/"))}) {
    if (std::optional<int> cpus = FromCpuMax(dir + "/cpu.max")) return cpus;
  }
  // v1.
  int64_t quota = 0, period = 0;
  if (absl::SimpleAtoi(FirstLine(root + "/cpu/cpu.cfs_quota_us"), &quota) &&
      absl::SimpleAtoi(FirstLine(root + "/cpu/cpu.cfs_period_us"), &period)) {
    return Cpus(quota, period);
  }
  return std::nullopt;
}

int AvailableCpus() {
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    cpus = std::min(cpus, std::max(1, CPU_COUNT(&set)));
  }
  // /proc/self/cgroup: "0::/PATH" under cgroup v2.
  std::string cgroup_path;
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "0::")) cgroup_path = line.substr(3);
  }
  if (std::optional<int> quota = CgroupCpuQuota("/sys/fs/cgroup", cgroup_path)) {
    cpus = std::min(cpus, *quota);
  }
  return std::max(1, cpus);
}

}  // namespace knapformer
