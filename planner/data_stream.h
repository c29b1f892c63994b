#ifndef KNAPFORMER_PLANNER_DATA_STREAM_H_
#define KNAPFORMER_PLANNER_DATA_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/balancer.h"

namespace knapformer {

// One synthetic data stream of the paper (section 4.1), written
// g{G}b{B}i{R}f{F}s{S}: sharded over G GPUs, B samples per GPU per step, R x R
// pixels, F frames, S = 1 for temporal compression (S = 0 otherwise).
struct DataCode {
  int64_t gpus = 0;
  int64_t batch = 0;
  int64_t resolution = 0;
  int64_t frames = 0;
  bool temporal_compression = false;

  // floor(R/16)^2 * T with T = F, or max(floor(F/3.4), 1) under compression.
  int64_t VisualTokens() const;
  std::string ToString() const;
};

// Parses comma-separated codes ("g16b4i256f1s0,g8b1i2048f1s0"). Strict grammar,
// every number >= 1 except S in {0, 1}; InvalidArgument names the bad code.
absl::StatusOr<std::vector<DataCode>> ParseDataCodes(absl::string_view codes);

// The paper's three 32-GPU scenarios by name: "low-res", "mixed-res", "joint".
// Returns the codes, or an empty string for an unknown name.
std::string ScenarioCodes(absl::string_view name);
std::vector<std::string> ScenarioNames();

// Seeded per-step sequence lengths: codes take contiguous rank ranges in list
// order and the block repeats to fill the world. Each rank and step draws one
// aspect factor m ~ U[0.96, 1.04]; each sample is int(visual_tokens * m) plus
// U{0..392} text tokens. Step s of rank r depends only on (seed, s, r), so any
// step can be generated alone and every run is reproducible.
class DataStream {
 public:
  // InvalidArgument unless world_size is a positive multiple of the codes'
  // total G.
  static absl::StatusOr<DataStream> Create(std::vector<DataCode> codes, int64_t world_size,
                                           uint64_t seed);

  RankLengths Batch(int64_t step) const;
  int64_t world_size() const { return static_cast<int64_t>(code_of_rank_.size()); }

 private:
  DataStream(std::vector<DataCode> codes, std::vector<int32_t> code_of_rank, uint64_t seed)
      : codes_(std::move(codes)), code_of_rank_(std::move(code_of_rank)), seed_(seed) {}

  std::vector<DataCode> codes_;
  std::vector<int32_t> code_of_rank_;
  uint64_t seed_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_DATA_STREAM_H_
