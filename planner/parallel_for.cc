#include "planner/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace knapformer {
namespace internal {

void ParallelFor(int32_t n, int32_t threads, const std::function<void(int32_t)>& body) {
  const int32_t workers = std::min(threads, n);
  if (workers <= 1) {
    for (int32_t i = 0; i < n; ++i) body(i);
    return;
  }
  // Work is taken one index at a time: the bodies (replicas, candidate
  // layouts) are few and of unequal cost.
  std::atomic<int32_t> next{0};
  auto work = [&] {
    for (int32_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i);
  };
  std::vector<std::thread> helpers;
  helpers.reserve(workers - 1);
  for (int32_t t = 1; t < workers; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace internal
}  // namespace knapformer
