// `knapformer plan` on any text: its JSON is refused with a message (never
// an internal error: that would be an invalid plan), or answered with JSON
// that parses back. An accepted request of up to 64 ranks is also solved
// and checked as the service's plans are (every rank's client accepts it).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "planner/plan_json.h"
#include "planner/topology.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/solve_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace knapformer;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::string> answer =
      PlanRequestToJson(text, CostKind::kTransformer, BalancerOptions(), std::nullopt);
  if (!answer.ok()) {
    fuzz::Require(!absl::IsInternal(answer.status()) && !answer.status().message().empty(),
                  "a refused request says why, and is not an invalid plan",
                  answer.status().ToString());
    return 0;
  }
  fuzz::Require(nlohmann::json::accept(*answer), "the printed plan is JSON");
  absl::StatusOr<PlanRequest> request = ParsePlanRequest(text);
  fuzz::Require(request.ok(), "an answered request parses");
  if (request->ranks.size() > 64) return 0;
  absl::StatusOr<World> world =
      World::Create(*Topology::Parse(request->topology), request->ranks.size());
  fuzz::Require(world.ok(), "an answered request makes a world");
  absl::StatusOr<CostModel> cost = CostModel::Create(request->d_model, request->gamma);
  fuzz::Require(cost.ok(), "an answered request's cost model is valid");
  fuzz::SolveAndCheck(*world, *cost, request->ranks, BalancerOptions());
  return 0;
}
