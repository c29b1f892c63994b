#ifndef KNAPFORMER_TOOLS_SIM_DATA_H_
#define KNAPFORMER_TOOLS_SIM_DATA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/attention_mask.h"
#include "planner/balancer.h"
#include "planner/data_stream.h"
#include "planner/masked_stream.h"
#include "planner/plan.h"

namespace knapformer {

// train-sim's data: the paper's streams (data codes or a scenario name) or
// a masked stream (planner/masked_stream.h), every length divided by
// `scale` (at least 1 token) so that CPU attention stays affordable. A
// masked sequence's mask is scaled with it: windows divided likewise, each
// span divided (at least 1 token) and the sequence's length their sum.
class SimData {
 public:
  struct Batch {
    RankLengths lengths;
    RankMasks masks;  // empty for the paper's streams
  };

  // InvalidArgument naming --data or --procs.
  static absl::StatusOr<SimData> Create(const std::string& data, int64_t procs, uint64_t seed,
                                        int64_t scale);

  Batch At(int64_t step) const;
  bool masked() const { return masked_.has_value(); }

 private:
  std::optional<DataStream> paper_;
  std::optional<MaskedStream> masked_;
  int64_t scale_ = 1;
};

// The masks of the sequences a rank's attention sees under `plan`, in the
// order it sees them (attention_lengths()), from the whole step's masks:
// what a rank planned without masks must compute with all the same.
std::vector<AttentionMask> HeldMasks(const RankPlan& plan, const RankMasks& masks);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_SIM_DATA_H_
