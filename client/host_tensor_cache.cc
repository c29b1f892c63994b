#include "client/host_tensor_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace knapformer {
namespace {

// What torch's own CPU allocator aligns to (c10::gAlignment), so kernels
// that vectorise on alignment behave the same on our tensors.
constexpr size_t kAlignment = 64;

struct Block {
  void* data = nullptr;
  size_t capacity = 0;
  // Where a kept block is listed; meaningless while it is in use.
  std::list<Block*>::iterator by_age;
  std::multimap<size_t, Block*>::iterator by_capacity;
};

// The capacity a request of `n` bytes gets: four size classes per power of
// two from kMinCachedHostBytes up, a multiple of kAlignment below it.
size_t CapacityOf(size_t n) {
  if (n < static_cast<size_t>(kMinCachedHostBytes)) {
    return (n + kAlignment - 1) / kAlignment * kAlignment;
  }
  size_t power = size_t{1} << (63 - __builtin_clzll(n));
  const size_t step = power / 4;
  return (n + step - 1) / step * step;
}

// KNAPFORMER_HOST_CACHE_BYTES when it is a number >= 0, else the default.
int64_t InitialLimit() {
  const char* text = std::getenv("KNAPFORMER_HOST_CACHE_BYTES");
  if (text == nullptr || *text == '\0') return kDefaultHostCacheBytes;
  char* end = nullptr;
  const long long bytes = std::strtoll(text, &end, 10);
  if (*end != '\0' || bytes < 0) return kDefaultHostCacheBytes;
  return static_cast<int64_t>(bytes);
}

class Pool {
 public:
  Block* Take(size_t n) {
    const size_t capacity = CapacityOf(n);
    if (capacity >= static_cast<size_t>(kMinCachedHostBytes)) {
      absl::MutexLock lock(&mu_);
      auto it = by_capacity_.find(capacity);
      if (it != by_capacity_.end()) {
        Block* block = it->second;
        by_capacity_.erase(it);
        by_age_.erase(block->by_age);
        cached_bytes_ -= static_cast<int64_t>(capacity);
        ++hits_;
        return block;
      }
      ++misses_;
    }
    void* data = std::aligned_alloc(kAlignment, capacity);
    if (data == nullptr) {
      // What the cache holds may be what is missing.
      std::vector<Block*> freed;
      {
        absl::MutexLock lock(&mu_);
        freed = Evict(0);
      }
      FreeAll(freed);
      data = std::aligned_alloc(kAlignment, capacity);
    }
    TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr,
                     "knapformer host tensor cache: cannot allocate ", capacity, " bytes");
    return new Block{data, capacity, {}, {}};
  }

  void Give(Block* block) {
    std::vector<Block*> freed;
    {
      absl::MutexLock lock(&mu_);
      if (block->capacity < static_cast<size_t>(kMinCachedHostBytes) ||
          static_cast<int64_t>(block->capacity) > limit_bytes_) {
        freed.push_back(block);
      } else {
        block->by_age = by_age_.insert(by_age_.end(), block);
        block->by_capacity = by_capacity_.emplace(block->capacity, block);
        cached_bytes_ += static_cast<int64_t>(block->capacity);
        freed = Evict(limit_bytes_);
      }
    }
    FreeAll(freed);
  }

  void SetLimit(int64_t bytes) {
    std::vector<Block*> freed;
    {
      absl::MutexLock lock(&mu_);
      limit_bytes_ = std::max<int64_t>(bytes, 0);
      freed = Evict(limit_bytes_);
    }
    FreeAll(freed);
  }

  HostCacheStats Stats() {
    absl::MutexLock lock(&mu_);
    return {limit_bytes_, cached_bytes_, hits_, misses_};
  }

 private:
  // Unlists the oldest kept blocks until at most `limit` bytes are kept;
  // the caller frees them, outside the lock.
  std::vector<Block*> Evict(int64_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Block*> evicted;
    while (cached_bytes_ > limit && !by_age_.empty()) {
      Block* oldest = by_age_.front();
      by_age_.pop_front();
      by_capacity_.erase(oldest->by_capacity);
      cached_bytes_ -= static_cast<int64_t>(oldest->capacity);
      evicted.push_back(oldest);
    }
    return evicted;
  }

  static void FreeAll(const std::vector<Block*>& blocks) {
    for (Block* block : blocks) {
      std::free(block->data);
      delete block;
    }
  }

  absl::Mutex mu_;
  int64_t limit_bytes_ ABSL_GUARDED_BY(mu_) = InitialLimit();
  int64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<Block*> by_age_ ABSL_GUARDED_BY(mu_);                    // oldest first
  std::multimap<size_t, Block*> by_capacity_ ABSL_GUARDED_BY(mu_);  // kept blocks
};

// Never destroyed: tensors from the cache may be freed during static
// destruction, after any function-local static would be gone.
Pool& ThePool() {
  static Pool* pool = new Pool;
  return *pool;
}

void ReleaseBlock(void* context) { ThePool().Give(static_cast<Block*>(context)); }

// torch 2.3 made c10::Allocator::allocate non-const and added copy_data
// (what a copy-on-write storage of this allocator is copied with when first
// written, e.g. after at::_lazy_clone).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define KNAPFORMER_TORCH_ALLOCATOR_2_3 1
#else
#define KNAPFORMER_TORCH_ALLOCATOR_2_3 0
#endif

class CachingHostAllocator final : public c10::Allocator {
 public:
#if KNAPFORMER_TORCH_ALLOCATOR_2_3
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    if (n == 0) return {nullptr, nullptr, nullptr, c10::Device(c10::kCPU)};
    Block* block = ThePool().Take(n);
    return {block->data, block, &ReleaseBlock, c10::Device(c10::kCPU)};
  }
#if KNAPFORMER_TORCH_ALLOCATOR_2_3
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }
#endif
};

c10::Allocator* TheAllocator() {
  static CachingHostAllocator* allocator = new CachingHostAllocator;
  return allocator;
}

}  // namespace

at::Tensor EmptyHostTensor(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  return at::detail::empty_generic(sizes, TheAllocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, /*memory_format_opt=*/{});
}

void SetHostCacheLimit(int64_t bytes) { ThePool().SetLimit(bytes); }

HostCacheStats GetHostCacheStats() { return ThePool().Stats(); }

}  // namespace knapformer
