#ifndef KNAPFORMER_SERVER_CPU_QUOTA_H_
#define KNAPFORMER_SERVER_CPU_QUOTA_H_

// How many CPUs this process may use: the planner sizes its solver pool by
// it. In a container the node's core count (std::thread::hardware_concurrency)
// is not what the pod may use: its CPU limit is a cgroup quota, and a solver
// thread per node core past it only queues behind the quota's throttling.

#include <optional>
#include <string>

namespace knapformer {

// The CPUs a cgroup quota allows, rounded up, read under `root` (a
// cgroup file system's mount point, /sys/fs/cgroup on a host): v2's
// cpu.max ("QUOTA PERIOD", or "max PERIOD" for none), in the cgroup
// `cgroup_path` names (from /proc/self/cgroup's "0::PATH" line) or at the
// root, else v1's cpu/cpu.cfs_quota_us over cpu/cpu.cfs_period_us (-1: none).
// Empty when no quota is set or none can be read.
std::optional<int> CgroupCpuQuota(const std::string& root, const std::string& cgroup_path);

// This process's CPUs: the fewest of its affinity mask's, the cgroup
// quota's (CgroupCpuQuota of /sys/fs/cgroup and /proc/self/cgroup) and the
// machine's; at least 1.
int AvailableCpus();

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_CPU_QUOTA_H_
