#ifndef KNAPFORMER_PLANNER_TOKEN_CAP_H_
#define KNAPFORMER_PLANNER_TOKEN_CAP_H_

#include <cstdint>
#include <limits>

namespace knapformer {

// Tokens a bag of `gpus` GPUs may hold under a cap of `max_tokens_per_gpu`
// per GPU (chunking spreads a bag's tokens over its GPUs to within one):
// their product, saturating at INT64_MAX, since the service and the CLI
// accept any cap up to INT64_MAX. REQUIRES: both > 0.
inline int64_t TokenCapOfBag(int64_t max_tokens_per_gpu, int64_t gpus) {
  return max_tokens_per_gpu > std::numeric_limits<int64_t>::max() / gpus
             ? std::numeric_limits<int64_t>::max()
             : max_tokens_per_gpu * gpus;
}

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_TOKEN_CAP_H_
