#ifndef KNAPFORMER_PLANNER_EXCHANGE_FIT_H_
#define KNAPFORMER_PLANNER_EXCHANGE_FIT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace knapformer {

// One timed all-to-all in a bag of `gpus` GPUs: each GPU held
// `bytes_per_gpu` for the exchange, of which (gpus - 1) / gpus left it (the
// rest stays), as in a Ulysses exchange or an equal-split route;
// `inter_node`: the bag spans more than one node.
struct ExchangeSample {
  int32_t gpus = 2;
  double bytes_per_gpu = 0;
  double seconds = 0;
  bool inter_node = false;
};

// seconds ~= latency + sent / bytes_per_second, sent = (gpus-1)/gpus *
// bytes_per_gpu: what Machine's intra_node_bytes_per_second and
// inter_node_bytes_per_second mean (planner/machine.h). Least squares on the
// relative residuals, as FitCostModel: timing noise grows with the time.
// The cost model has no latency term (it prices tokens), so the latency is
// reported for judging the fit, not used; a fit whose latency comes out
// negative (or whose sizes are too close to tell it) is redone through the
// origin (latency 0).
struct LinkFit {
  double bytes_per_second = 0;
  double latency_seconds = 0;
  int64_t samples = 0;
  double r_squared = 0;           // 1 - SSE / SST of seconds
  double max_relative_error = 0;  // max |residual| / seconds
};

struct ExchangeFit {
  std::optional<LinkFit> intra_node, inter_node;  // absent: no samples of that link
};

// InvalidArgument for no samples, gpus outside [2, 65536], negative or
// non-finite bytes or seconds, or a link whose samples move fewer than two
// distinct byte counts (latency and bandwidth cannot be told apart);
// FailedPrecondition when a link's times do not grow with the bytes.
absl::StatusOr<ExchangeFit> FitExchanges(const std::vector<ExchangeSample>& samples);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_EXCHANGE_FIT_H_
