#include <cstdlib>

#include "client/host_tensor_cache.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

TEST(HostTensorCacheEnvironmentTest, TakesItsLimitFromTheEnvironment) {
  // Set by the BUILD rule, so that it is there before the first allocation.
  ASSERT_STREQ(std::getenv("KNAPFORMER_HOST_CACHE_BYTES"), "3145728");
  EXPECT_EQ(GetHostCacheStats().limit_bytes, 3 * (int64_t{1} << 20));
  { at::Tensor t = EmptyHostTensor({int64_t{1} << 20}, at::kFloat); }  // 4 MiB: over it
  EXPECT_EQ(GetHostCacheStats().cached_bytes, 0);
  { at::Tensor t = EmptyHostTensor({int64_t{1} << 19}, at::kFloat); }  // 2 MiB: kept
  EXPECT_EQ(GetHostCacheStats().cached_bytes, 2 * (int64_t{1} << 20));
}

}  // namespace
}  // namespace knapformer
