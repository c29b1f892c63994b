#ifndef KNAPFORMER_PLANNER_REPLICA_BAGS_H_
#define KNAPFORMER_PLANNER_REPLICA_BAGS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace knapformer {

// The bags of one replica as packing, refinement and the locality repair see
// them. A bag's size decides which sequences it may take (a sequence only
// goes to a bag of at most its length in GPUs) and its token cap; its speed
// turns its workload into time: time = workload / speed. A bag of G GPUs at
// relative speed 1 has speed G; with rank speeds (rank_speeds.h) it is G
// times its slowest GPU's, since Ulysses gives every GPU of the bag the same
// heads and equal chunks, so the bag runs at that GPU's pace.
struct ReplicaBags {
  // Every GPU at speed 1: each bag's speed is its size. Implicit, so that a
  // list of sizes reads as the bags it describes.
  ReplicaBags(std::vector<int32_t> sizes)  // NOLINT(runtime/explicit)
      : gpus(std::move(sizes)), speed(gpus.begin(), gpus.end()) {}
  // REQUIRES: as many speeds as sizes, each > 0.
  ReplicaBags(std::vector<int32_t> sizes, std::vector<double> speeds)
      : gpus(std::move(sizes)), speed(std::move(speeds)) {}

  int32_t size() const { return static_cast<int32_t>(gpus.size()); }
  // Whether some bag's speed is not its size: GPUs of unequal speeds.
  bool uneven() const {
    for (size_t b = 0; b < gpus.size(); ++b) {
      if (speed[b] != gpus[b]) return true;
    }
    return false;
  }
  // Bag b's time for `workload`. Dividing by one is exact, and skipping it
  // takes a division's latency off the packing's hottest loop.
  double Time(int32_t b, double workload) const {
    return speed[b] == 1.0 ? workload : workload / speed[b];
  }

  std::vector<int32_t> gpus;  // ascending, as topologies lay bags out
  std::vector<double> speed;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_REPLICA_BAGS_H_
