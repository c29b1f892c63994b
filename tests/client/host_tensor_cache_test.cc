#include "client/host_tensor_cache.h"

#include <atomic>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <torch/version.h>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Every test starts from an empty cache with the default limit.
class HostTensorCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetHostCacheLimit(0);
    SetHostCacheLimit(kDefaultHostCacheBytes);
  }
  void TearDown() override { SetHostCacheLimit(kDefaultHostCacheBytes); }
};

at::Tensor Floats(int64_t bytes) { return EmptyHostTensor({bytes / 4}, at::kFloat); }

TEST_F(HostTensorCacheTest, GivesContiguousCpuTensorsOfTheShapeAndDtype) {
  at::Tensor t = EmptyHostTensor({3, 5, 7}, at::kDouble);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.scalar_type(), at::kDouble);
  EXPECT_EQ(t.sizes().vec(), (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  t.copy_(at::arange(105, at::kDouble).reshape({3, 5, 7}));
  EXPECT_TRUE(at::equal(t.sum(), at::scalar_tensor(104.0 * 105 / 2, at::kDouble)));

  at::Tensor none = EmptyHostTensor({0, 4}, at::kFloat);
  EXPECT_EQ(none.numel(), 0);
}

TEST_F(HostTensorCacheTest, ReusesAFreedBlockForARequestOfItsSizeClass) {
  const HostCacheStats before = GetHostCacheStats();
  void* first = nullptr;
  {
    at::Tensor t = Floats(kMiB + 100 * 1024);
    first = t.data_ptr();
    EXPECT_EQ(GetHostCacheStats().cached_bytes, 0);
  }
  // Freed: kept, with its class's capacity (1.25 MiB).
  EXPECT_EQ(GetHostCacheStats().cached_bytes, kMiB + kMiB / 4);
  at::Tensor again = Floats(kMiB + 200 * 1024);  // another size, the same class
  EXPECT_EQ(again.data_ptr(), first);
  const HostCacheStats after = GetHostCacheStats();
  EXPECT_EQ(after.hits - before.hits, 1);
  EXPECT_EQ(after.misses - before.misses, 1);
  EXPECT_EQ(after.cached_bytes, 0);
}

TEST_F(HostTensorCacheTest, ABlockOfAnotherClassIsNotHandedOut) {
  void* small_block = nullptr;
  {
    at::Tensor t = Floats(kMiB);
    small_block = t.data_ptr();
  }
  at::Tensor larger = Floats(kMiB + 4096);  // 1.25 MiB class: the 1 MiB block is too small
  EXPECT_NE(larger.data_ptr(), small_block);
  EXPECT_EQ(GetHostCacheStats().cached_bytes, kMiB);
  // The kept block still serves its own class, and holds what is written.
  at::Tensor same = Floats(kMiB);
  EXPECT_EQ(same.data_ptr(), small_block);
  same.fill_(2.5f);
  EXPECT_EQ(same.sum().item<double>(), 2.5 * (kMiB / 4));
}

TEST_F(HostTensorCacheTest, SmallBlocksGoBackToMalloc) {
  const HostCacheStats before = GetHostCacheStats();
  { at::Tensor t = Floats(kMinCachedHostBytes / 2); }
  const HostCacheStats after = GetHostCacheStats();
  EXPECT_EQ(after.cached_bytes, 0);
  EXPECT_EQ(after.hits, before.hits);
  EXPECT_EQ(after.misses, before.misses);
}

TEST_F(HostTensorCacheTest, KeepsAtMostTheLimitFreeingTheOldestFirst) {
  SetHostCacheLimit(2 * kMiB);
  std::vector<at::Tensor> held = {Floats(kMiB), Floats(kMiB), Floats(kMiB)};
  std::vector<void*> pointers;
  for (const at::Tensor& t : held) pointers.push_back(t.data_ptr());
  held.clear();  // freed in order: the first block is the oldest
  EXPECT_EQ(GetHostCacheStats().cached_bytes, 2 * kMiB);
  // The two kept blocks are the last two freed; the next two requests get them.
  at::Tensor a = Floats(kMiB);
  at::Tensor b = Floats(kMiB);
  const std::set<void*> reused = {a.data_ptr(), b.data_ptr()};
  EXPECT_EQ(reused, (std::set<void*>{pointers[1], pointers[2]}));
  EXPECT_EQ(GetHostCacheStats().cached_bytes, 0);
}

TEST_F(HostTensorCacheTest, ABlockLargerThanTheLimitIsNotKept) {
  SetHostCacheLimit(kMiB);
  { at::Tensor t = Floats(2 * kMiB); }
  EXPECT_EQ(GetHostCacheStats().cached_bytes, 0);
}

TEST_F(HostTensorCacheTest, LoweringTheLimitFreesWhatIsBeyondIt) {
  { std::vector<at::Tensor> held = {Floats(kMiB), Floats(kMiB), Floats(kMiB)}; }
  EXPECT_EQ(GetHostCacheStats().cached_bytes, 3 * kMiB);
  SetHostCacheLimit(kMiB);
  EXPECT_EQ(GetHostCacheStats().limit_bytes, kMiB);
  EXPECT_EQ(GetHostCacheStats().cached_bytes, kMiB);
  SetHostCacheLimit(-5);  // taken as 0: the cache is off
  EXPECT_EQ(GetHostCacheStats().limit_bytes, 0);
  EXPECT_EQ(GetHostCacheStats().cached_bytes, 0);
  { at::Tensor t = Floats(kMiB); }
  EXPECT_EQ(GetHostCacheStats().cached_bytes, 0);
}

TEST_F(HostTensorCacheTest, TensorsResizeAndViewLikeAnyOther) {
  at::Tensor t = Floats(kMiB);
  t.copy_(at::arange(kMiB / 4, at::kFloat));
  at::Tensor view = t.narrow(0, 10, 5);
  t.resize_({kMiB});  // grows through the cache's allocator, keeping the data
  EXPECT_EQ(t.size(0), kMiB);
  EXPECT_EQ(t[kMiB / 4 - 1].item<float>(), static_cast<float>(kMiB / 4 - 1));
  at::Tensor grad_input = EmptyHostTensor({4, 3}, at::kDouble).fill_(1.0).requires_grad_();
  (grad_input * 3).sum().backward();
  EXPECT_TRUE(at::equal(grad_input.grad(), at::full({4, 3}, 3.0, at::kDouble)));
  EXPECT_EQ(view.size(0), 5);  // the old storage lives on in its views
}

// torch 2.3+ copies a storage through its allocator's clone, which takes a
// block of the cache and fills it with copy_data (ours since 2.3).
TEST_F(HostTensorCacheTest, TheAllocatorClonesAStorageIntoABlockOfItsOwn) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  at::Tensor t = Floats(kMiB);
  t.copy_(at::arange(kMiB / 4, at::kFloat));
  c10::Allocator* allocator = t.storage().unsafeGetStorageImpl()->allocator();
  ASSERT_NE(allocator, nullptr);
  const int64_t misses = GetHostCacheStats().misses;
  c10::DataPtr copy = allocator->clone(t.data_ptr(), kMiB);
  EXPECT_EQ(GetHostCacheStats().misses, misses + 1);  // a block from the cache
  ASSERT_NE(copy.get(), nullptr);
  EXPECT_NE(copy.get(), t.data_ptr());
  const float* values = static_cast<const float*>(copy.get());
  EXPECT_EQ(values[7], 7.0f);
  EXPECT_EQ(values[kMiB / 4 - 1], static_cast<float>(kMiB / 4 - 1));
#else
  GTEST_SKIP() << "torch " << TORCH_VERSION << " has no Allocator::clone (2.3+)";
#endif
}

TEST_F(HostTensorCacheTest, ThreadsNeverShareABlockInUse) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([i, &corrupted] {
      for (int round = 0; round < kRounds; ++round) {
        const int64_t bytes = kMiB / 4 * (1 + (i + round) % 3);
        at::Tensor t = EmptyHostTensor({bytes / 4}, at::kInt);
        const int value = i * kRounds + round;
        t.fill_(value);
        std::this_thread::yield();
        if (!at::equal(t, at::full_like(t, value))) corrupted.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(corrupted.load(), 0);
  const HostCacheStats stats = GetHostCacheStats();
  EXPECT_GT(stats.hits, 0);
  EXPECT_LE(stats.cached_bytes, stats.limit_bytes);
}

}  // namespace
}  // namespace knapformer
