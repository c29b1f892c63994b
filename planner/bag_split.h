#ifndef KNAPFORMER_PLANNER_BAG_SPLIT_H_
#define KNAPFORMER_PLANNER_BAG_SPLIT_H_

// How a bag of G GPUs cuts a sequence of l tokens into the plan's chunks:
// every GPU of the bag gets floor(l / G) tokens, and the l mod G extra
// tokens go one a GPU, cyclically, from the bag's rotation on (the position
// after the last extra token it dealt, 0 at first). BuildPlan cuts the
// chunks by it and PredictReplica replays it, so a predicted step counts
// the plan's tokens per GPU exactly: one rule, not two copies of it.

#include <algorithm>
#include <cstdint>
#include <limits>

namespace knapformer {

struct BagSplit {
  int64_t share = 0;  // floor(l / G): every GPU's tokens
  int32_t extra = 0;  // l mod G: the GPUs from the rotation on with one more
};

inline BagSplit SplitOverBag(int64_t length, int32_t gpus) {
  // 32-bit division where the length allows (every checked length does,
  // CostModel::kMaxLength): a 64-bit one costs about twice as much, and
  // predicting a step divides once per sequence and candidate layout.
  if (length >= 0 && length <= std::numeric_limits<uint32_t>::max()) {
    const uint32_t length32 = static_cast<uint32_t>(length);
    const uint32_t gpus32 = static_cast<uint32_t>(gpus);
    return {length32 / gpus32, static_cast<int32_t>(length32 % gpus32)};
  }
  return {length / gpus, static_cast<int32_t>(length % gpus)};
}

// The chunks a sequence makes in the bag: one per GPU, fewer when it is
// shorter than the bag (a GPU with no token gets no chunk).
inline int64_t ChunksOverBag(int64_t length, int32_t gpus) {
  return std::min<int64_t>(length, gpus);
}

// The tokens of the chunk at `position` of the bag, the rotation at `start`.
inline int64_t ChunkAt(const BagSplit& split, int32_t position, int32_t start, int32_t gpus) {
  int32_t turn = position - start;  // (position - start) mod gpus, without a division
  if (turn < 0) turn += gpus;
  return split.share + (turn < split.extra ? 1 : 0);
}

// The rotation after `split` is dealt from `start` (both under gpus: one
// subtraction, not a division).
inline int32_t NextRotation(int32_t start, const BagSplit& split, int32_t gpus) {
  const int32_t next = start + split.extra;
  return next >= gpus ? next - gpus : next;
}

// The tokens at `position` once sequences whose shares sum to `shares` and
// whose extras sum to `extras` are dealt, the rotation starting at 0.
inline int64_t TokensAt(int64_t shares, int64_t extras, int32_t gpus, int32_t position) {
  return shares + extras / gpus + (position < extras % gpus ? 1 : 0);
}

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_BAG_SPLIT_H_
