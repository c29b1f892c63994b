#ifndef KNAPFORMER_PLANNER_PARALLEL_FOR_H_
#define KNAPFORMER_PLANNER_PARALLEL_FOR_H_

#include <cstdint>
#include <functional>

namespace knapformer {
namespace internal {

// Runs body(i) for every i in [0, n), on up to `threads` threads, the
// caller's among them (threads <= 1 or n <= 1: all on the caller's, in
// order). Each i runs exactly once; which thread runs it is not specified,
// so `body` must write only what belongs to its i. Returns when all ran.
void ParallelFor(int32_t n, int32_t threads, const std::function<void(int32_t)>& body);

}  // namespace internal
}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_PARALLEL_FOR_H_
