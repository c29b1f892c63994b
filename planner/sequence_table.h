#ifndef KNAPFORMER_PLANNER_SEQUENCE_TABLE_H_
#define KNAPFORMER_PLANNER_SEQUENCE_TABLE_H_

#include <cstdint>
#include <vector>

namespace knapformer {

// One replica's non-empty sequences, heaviest first (workload descending,
// ties by id ascending), as parallel arrays: the working set packing,
// refinement and the locality repair share, so none of them copies it.
// Placements are separate vectors of bags indexed the same way.
struct SequenceTable {
  std::vector<double> workload;
  std::vector<int64_t> length;    // tokens
  std::vector<int32_t> id;        // global sequence id: the deterministic tie-break
  std::vector<int32_t> home_bag;  // the bag of its source rank

  int32_t size() const { return static_cast<int32_t>(workload.size()); }
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_SEQUENCE_TABLE_H_
