// Checks a planner started from the container image, from the host
// (deploy/docker/build.sh runs it against the smoke-test container):
//   image_probe GRPC_PORT METRICS_PORT JOB
// 1. gRPC health: the server ("") and knapformer.v1.Planner are SERVING;
// 2. one PlanGroup of JOB (8 ranks, 25 tokens, g1n2+g2n1+g4n1) answers a plan
//    that is a valid plan of those lengths (planner/validate.h: every token
//    routed exactly once) and whose heaviest rank is no heavier than before;
// 3. GET /metrics on METRICS_PORT shows JOB's 25 planned tokens.
// Prints one line per check; exits 0 when all pass, else 1 after the first
// failure, naming it. Every call has a deadline: a hung server fails, it does
// not hang the build.
#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "planner/plan_from_chunks.h"
#include "proto/plan_proto.h"
#include "proto/step_problem.h"
#include "tests/server/service_test_util.h"

namespace knapformer {
namespace {

using testing_util::HttpGet;
using testing_util::LocalChannel;
using testing_util::MakeRequest;
using testing_util::StepParams;

const RankLengths kLengths = {{5}, {}, {7, 9}, {1}, {}, {}, {3}, {}};
constexpr int64_t kTokens = 25;

std::string Fail(const std::string& check, const std::string& why) {
  return absl::StrCat(check, ": ", why);
}

// Empty when the check passed, else what failed.
std::string CheckHealth(const std::shared_ptr<grpc::Channel>& channel) {
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const std::string service : {"", "knapformer.v1.Planner"}) {
    const std::string check = absl::StrCat("health of '", service, "'");
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status status = health->Check(&context, request, &response);
    if (!status.ok()) {
      return Fail(check, absl::StrCat("RPC failed: code ", status.error_code(), " ",
                                      status.error_message()));
    }
    if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
      return Fail(check, absl::StrCat("status ", response.status(), ", not SERVING"));
    }
    std::cout << "ok: " << check << " is SERVING\n";
  }
  return "";
}

std::string CheckPlanGroup(const std::shared_ptr<grpc::Channel>& channel, const std::string& job) {
  const std::string check = "PlanGroup";
  StepParams params;
  params.job_id = job;
  v1::PlanGroupRequest request;
  *request.mutable_spec() =
      MakeRequest(params, static_cast<int32_t>(kLengths.size()), 0, {}).spec();
  for (const auto& rank : kLengths) {
    request.add_ranks()->mutable_sequence_lengths()->Add(rank.begin(), rank.end());
  }
  v1::PlanGroupResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status status = v1::Planner::NewStub(channel)->PlanGroup(&context, request, &response);
  if (!status.ok()) {
    return Fail(check, absl::StrCat("RPC failed: code ", status.error_code(), " ",
                                    status.error_message()));
  }
  if (response.balance().total_tokens() != kTokens) {
    return Fail(check, absl::StrCat("total_tokens ", response.balance().total_tokens(),
                                    ", want ", kTokens));
  }
  // The client's own check of a group answer: the plan rebuilt from the
  // chunk table on the answer's layout must be a valid plan of kLengths
  // (every token routed exactly once, within one bag, indexes agreeing).
  auto chunks = ChunksFromProto(response.chunks());
  if (!chunks.ok()) return Fail(check, std::string(chunks.status().message()));
  auto problem = StepProblemOf(request.spec());
  if (!problem.ok()) return Fail(check, std::string(problem.status().message()));
  auto world = WorldOfLayout(*problem, response.balance().layout());
  if (!world.ok()) return Fail(check, std::string(world.status().message()));
  auto plan = PlanFromChunks(*world, problem->cost, kLengths, *std::move(chunks));
  if (!plan.ok()) return Fail(check, std::string(plan.status().message()));
  const auto max_of = [](const auto& values) {
    return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
  };
  if (max_of(response.workload_after()) > max_of(response.workload_before())) {
    return Fail(check, "the planned heaviest rank is heavier than the unbalanced one");
  }
  std::cout << "ok: PlanGroup planned " << kTokens << " tokens over " << kLengths.size()
            << " ranks in " << plan->chunks.size() << " chunks\n";
  return "";
}

std::string CheckMetrics(int port, const std::string& job) {
  const std::string check = "GET /metrics";
  absl::StatusOr<std::string> page = HttpGet(port, "/metrics");
  if (!page.ok()) return Fail(check, std::string(page.status().message()));
  const std::string series = "knapformer_planner_tokens_total{";
  std::istringstream lines(*page);
  for (std::string line; std::getline(lines, line);) {
    if (!absl::StartsWith(line, series) ||
        !absl::StrContains(line, absl::StrCat("job_id=\"", job, "\""))) {
      continue;
    }
    double value = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value) || value != kTokens) {
      return Fail(check, absl::StrCat("'", line, "', want ", kTokens, " tokens"));
    }
    std::cout << "ok: /metrics shows " << line << "\n";
    return "";
  }
  return Fail(check, absl::StrCat("no ", series, "job_id=\"", job, "\"...} line in ",
                                  page->size(), " bytes"));
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  int port = 0, metrics_port = 0;
  if (argc != 4 || !absl::SimpleAtoi(argv[1], &port) ||
      !absl::SimpleAtoi(argv[2], &metrics_port)) {
    std::cerr << "usage: image_probe GRPC_PORT METRICS_PORT JOB\n";
    return 2;
  }
  const std::string job = argv[3];
  auto channel = knapformer::testing_util::LocalChannel(port);
  std::string failure = knapformer::CheckHealth(channel);
  if (failure.empty()) failure = knapformer::CheckPlanGroup(channel, job);
  if (failure.empty()) failure = knapformer::CheckMetrics(metrics_port, job);
  if (!failure.empty()) {
    std::cerr << "image_probe: " << failure << "\n";
    return 1;
  }
  return 0;
}
