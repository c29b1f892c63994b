#ifndef KNAPFORMER_TRANSPORT_RESOURCE_POOL_H_
#define KNAPFORMER_TRANSPORT_RESOURCE_POOL_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace knapformer {

// Handles that cost a driver call to make and to destroy (the NCCL
// transport's CUDA events: one per exchange otherwise), kept for reuse:
// Take() hands out a kept one, or makes one; Give() keeps it again.
// Thread-safe: the transport's watchdog gives events back from its thread.
// Clear() and the destructor destroy what is kept; a handle given back
// after them is destroyed at once.
template <typename T>
class ResourcePool {
 public:
  using Make = std::function<absl::StatusOr<T>()>;
  using Destroy = std::function<void(T)>;

  ResourcePool(Make make, Destroy destroy)
      : make_(std::move(make)), destroy_(std::move(destroy)) {}
  ResourcePool(const ResourcePool&) = delete;
  ResourcePool& operator=(const ResourcePool&) = delete;
  ~ResourcePool() { Clear(); }

  absl::StatusOr<T> Take() {
    {
      absl::MutexLock lock(&mu_);
      if (!kept_.empty()) {
        T item = kept_.back();
        kept_.pop_back();
        return item;
      }
      ++made_;
    }
    return make_();
  }

  void Give(T item) {
    {
      absl::MutexLock lock(&mu_);
      if (!cleared_) {
        kept_.push_back(item);
        return;
      }
    }
    destroy_(item);
  }

  // Destroys every kept handle; later ones given back are destroyed.
  void Clear() {
    std::vector<T> kept;
    {
      absl::MutexLock lock(&mu_);
      cleared_ = true;
      kept.swap(kept_);
    }
    for (T item : kept) destroy_(item);
  }

  // How many handles Take() has had to make.
  int64_t made() const {
    absl::MutexLock lock(&mu_);
    return made_;
  }

 private:
  const Make make_;
  const Destroy destroy_;
  mutable absl::Mutex mu_;
  std::vector<T> kept_ ABSL_GUARDED_BY(mu_);
  int64_t made_ ABSL_GUARDED_BY(mu_) = 0;
  bool cleared_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_RESOURCE_POOL_H_
