// The pool the NCCL transport keeps its CUDA events in, with counted ints in
// place of events: reuse instead of one make per exchange, a failed make,
// handles given back from other threads, and everything destroyed once.
#include "transport/resource_pool.h"

#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

struct Counts {
  int made = 0;
  std::multiset<int> destroyed;
};

ResourcePool<int>::Make Maker(Counts* counts) {
  return [counts]() -> absl::StatusOr<int> { return ++counts->made; };
}
ResourcePool<int>::Destroy Destroyer(Counts* counts) {
  return [counts](int item) { counts->destroyed.insert(item); };
}

TEST(ResourcePoolTest, ReusesWhatIsGivenBackInsteadOfMakingOnePerUse) {
  Counts counts;
  {
    ResourcePool<int> pool(Maker(&counts), Destroyer(&counts));
    for (int exchange = 0; exchange < 100; ++exchange) {
      const int event = pool.Take().value();
      pool.Give(event);
    }
    EXPECT_EQ(counts.made, 1);
    EXPECT_EQ(pool.made(), 1);
    // Two out at once need two.
    const int a = pool.Take().value(), b = pool.Take().value();
    EXPECT_NE(a, b);
    pool.Give(a);
    pool.Give(b);
    EXPECT_EQ(counts.made, 2);
    EXPECT_TRUE(counts.destroyed.empty());
  }
  EXPECT_EQ(counts.destroyed, (std::multiset<int>{1, 2}));  // each once, by the destructor
}

TEST(ResourcePoolTest, AFailedMakeIsTheCallersError) {
  ResourcePool<int> pool([]() -> absl::StatusOr<int> { return absl::InternalError("no"); },
                         [](int) {});
  EXPECT_EQ(pool.Take().status().code(), absl::StatusCode::kInternal);
}

TEST(ResourcePoolTest, HandlesGivenBackFromOtherThreadsAndAfterClearAreDestroyedOnce) {
  Counts counts;
  ResourcePool<int> pool(Maker(&counts), Destroyer(&counts));
  std::vector<int> out;
  for (int i = 0; i < 8; ++i) out.push_back(pool.Take().value());
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&pool, &out, i] { pool.Give(out[i]); });
  }
  for (std::thread& t : threads) t.join();
  pool.Clear();
  EXPECT_EQ(counts.destroyed.size(), 4u);
  for (int i = 4; i < 8; ++i) pool.Give(out[i]);  // after Clear: destroyed at once
  EXPECT_EQ(counts.destroyed, (std::multiset<int>{1, 2, 3, 4, 5, 6, 7, 8}));
}

}  // namespace
}  // namespace knapformer
