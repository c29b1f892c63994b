// The CPUs a cgroup quota allows (the solver pool's default size), read from
// made-up cgroup trees of both versions.
#include "server/cpu_quota.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/cgroup-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf " + root_).c_str()); }
  void Write(const std::string& relative, const std::string& text) {
    const std::string path = root_ + "/" + relative;
    std::system(("mkdir -p \"$(dirname " + path + ")\"").c_str());
    std::ofstream(path) << text;
  }
  std::string root_;
};

TEST_F(CgroupTree, V2QuotaIsRoundedUp) {
  Write("cpu.max", "150000 100000\n");
  EXPECT_EQ(CgroupCpuQuota(root_, "/"), 2);
  Write("cpu.max", "100000 100000\n");
  EXPECT_EQ(CgroupCpuQuota(root_, ""), 1);
  Write("cpu.max", "50000 100000\n");  // half a CPU: still one thread
  EXPECT_EQ(CgroupCpuQuota(root_, "/"), 1);
}

TEST_F(CgroupTree, V2WithoutAQuotaIsNone) {
  Write("cpu.max", "max 100000\n");
  EXPECT_FALSE(CgroupCpuQuota(root_, "/").has_value());
}

TEST_F(CgroupTree, V2ReadsTheProcesssOwnCgroupFirst) {
  Write("cpu.max", "max 100000\n");
  Write("kubepods/pod1/cpu.max", "400000 100000\n");
  EXPECT_EQ(CgroupCpuQuota(root_, "/kubepods/pod1"), 4);
}

TEST_F(CgroupTree, V1QuotaOverPeriod) {
  Write("cpu/cpu.cfs_quota_us", "250000\n");
  Write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuQuota(root_, "/"), 3);
  Write("cpu/cpu.cfs_quota_us", "-1\n");
  EXPECT_FALSE(CgroupCpuQuota(root_, "/").has_value());
}

TEST_F(CgroupTree, NothingReadableIsNone) {
  EXPECT_FALSE(CgroupCpuQuota(root_, "/").has_value());
  Write("cpu.max", "garbage\n");
  EXPECT_FALSE(CgroupCpuQuota(root_, "/").has_value());
}

TEST(AvailableCpus, AtLeastOneAndNoMoreThanTheMachines) {
  const int cpus = AvailableCpus();
  EXPECT_GE(cpus, 1);
  EXPECT_LE(cpus, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace knapformer
