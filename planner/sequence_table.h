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

// The same sequences before any layout: a SequenceTable in the packer's
// order without home_bag, and each one's source rank (relative to its
// replica's first). The order depends only on lengths, masks and the cost
// model, so every layout auto tries for a replica shares one sort.
struct SortedSequences {
  SequenceTable table;        // home_bag empty
  std::vector<int32_t> rank;  // rank[k]: sequence k's source rank in the replica
  double total = 0;           // the sum of their workloads
  bool masked = false;        // whether any has a mask other than full
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_SEQUENCE_TABLE_H_
