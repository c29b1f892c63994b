// A PlanGroup request as it comes off the network (any bytes): refused with
// a message naming a field, or solved as the service solves it (worlds up to
// 64 ranks); the plan must be valid and accepted by every rank's client
// checks.
#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"
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
  v1::PlanGroupRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const ServiceLimits limits;
  absl::StatusOr<CheckedGroupRequest> checked = CheckPlanGroupRequest(request, limits);
  if (!checked.ok()) {
    fuzz::RequireNamesAField(checked.status());
    return 0;
  }
  const int32_t world_size = request.spec().world_size();
  fuzz::Require(request.ranks_size() == world_size, "one entry per rank");
  fuzz::Require(checked->input.world_size() == world_size, "the checked input is the world's");
  if (world_size > 64) return 0;
  fuzz::SolveStepAndCheck(checked->spec, checked->input,
                          BalancerOptionsForSpec(BalancerOptions(), request.spec()),
                          request.spec().token_bytes());
  return 0;
}
