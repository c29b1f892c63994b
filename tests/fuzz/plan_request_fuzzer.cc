// A Plan request as it comes off the network (any bytes): it parses or not;
// the service's checks refuse it with a message naming a field, or accept
// it; an accepted step is solved as the service solves it, with every rank
// sending this rank's lengths rotated (worlds up to 64 ranks), and the plan
// must be valid and accepted by every rank's client checks.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "google/protobuf/stubs/logging.h"
#include "knapformer/v1/planner.pb.h"
#include "proto/mask_proto.h"
#include "proto/plan_proto.h"
#include "server/request_check.h"
#include "server/service_limits.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/solve_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace knapformer;
  // Invalid UTF-8 in a string field is a parse failure; protobuf's log line
  // about each one would drown the fuzzer's output.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  v1::PlanRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  static WorldCache* const cache = new WorldCache(8);  // the service's, bounded
  const ServiceLimits limits;
  absl::StatusOr<CheckedSpec> checked = CheckPlanRequest(request, limits, cache);
  if (!checked.ok()) {
    fuzz::RequireNamesAField(checked.status());
    return 0;
  }
  const int32_t world_size = request.spec().world_size();
  fuzz::Require(world_size == checked->world_size, "the world is the spec's");
  fuzz::Require(request.rank() >= 0 && request.rank() < world_size, "the rank is in the world");
  fuzz::Require(CheckLocality(request.spec()).ok(), "an accepted spec has a known locality");
  const int n = request.sequence_lengths_size();
  if (world_size > 64 || int64_t{n} * world_size > (1 << 14)) return 0;
  RankLengths lengths(world_size);
  RankMasks masks(request.attention_masks_size() > 0 ? world_size : 0);
  for (int32_t r = 0; r < world_size; ++r) {
    for (int i = 0; i < n; ++i) {
      lengths[r].push_back(request.sequence_lengths((i + r) % n));
      if (masks.empty()) continue;
      // Accepted masks convert (CheckPlanRequest checked each).
      absl::StatusOr<AttentionMask> mask =
          MaskFromProto(request.attention_masks((i + r) % n), "attention_masks");
      fuzz::Require(mask.ok(), "an accepted mask converts", mask.status().ToString());
      masks[r].push_back(*std::move(mask));
    }
  }
  // Every rank alike: the step's one check passes what each request passed.
  absl::StatusOr<BalancerInput> input =
      BalancerInput::Check(world_size, std::move(lengths), std::move(masks), BalancerLimits());
  fuzz::Require(input.ok(), "an accepted rank's input passes the step's check",
                input.status().ToString());
  fuzz::SolveStepAndCheck(*checked, *input,
                          BalancerOptionsForSpec(BalancerOptions(), request.spec()),
                          request.spec().token_bytes());
  return 0;
}
