// Drives a running planner so that every metric the dashboard and the rules
// read has data:
//   drive_planner PORT JOB STEPS   STEPS complete steps of JOB (8 ranks,
//                                  mixed lengths), numbered from 0, the last
//                                  one a PlanGroup with rank 5 at 0.6 of the
//                                  others' speed (knapformer_rank_speed)
//   drive_planner PORT JOB faults  one refused request (INVALID_ARGUMENT)
//                                  and one step that times out waiting for
//                                  ranks (give the server a short
//                                  --rendezvous-timeout-ms)
//   drive_planner PORT JOB stranger STEP
//                                  a stranger: rank 0 of a 4-rank group asks
//                                  for STEP of JOB with its own spec (gamma
//                                  0.5, topology g1n4) and waits (until the
//                                  server's rendezvous timeout or 120 s)
// Two calls, so that Prometheus can see a job's counters at 0 before the
// faults raise them (increase() needs two samples). Exit 0 when every call
// answered as expected, 1 otherwise (naming it).
#include <chrono>
#include <iostream>

#include "absl/strings/numbers.h"
#include "tests/server/service_test_util.h"

namespace knapformer {
namespace {

using testing_util::MakeGroupRequests;
using testing_util::MakeRequest;
using testing_util::PlanConcurrently;
using testing_util::RandomLengths;
using testing_util::StepParams;

constexpr int kRanks = 8;

constexpr uint64_t kFaultSteps = 1000000;  // step numbers no run of steps reaches

int DriveSteps(v1::Planner::Stub* stub, const std::string& job, int steps) {
  StepParams params;
  params.job_id = job;
  params.token_bytes = 1024;
  for (int step = 0; step < steps; ++step) {
    params.step = step;
    if (step == steps - 1) {
      v1::PlanGroupRequest request;
      *request.mutable_spec() = MakeRequest(params, kRanks, 0, {}).spec();
      for (const auto& rank : RandomLengths(kRanks, step)) {
        request.add_ranks()->mutable_sequence_lengths()->Add(rank.begin(), rank.end());
      }
      for (int r = 0; r < kRanks; ++r) request.add_rank_speeds(r == 5 ? 0.6 : 1.0);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::PlanGroupResponse response;
      const grpc::Status status = stub->PlanGroup(&context, request, &response);
      if (!status.ok()) {
        std::cerr << "step " << step << " (PlanGroup): " << status.error_message() << "\n";
        return 1;
      }
      continue;
    }
    auto results = PlanConcurrently(stub, MakeGroupRequests(params, RandomLengths(kRanks, step)));
    for (size_t r = 0; r < results.size(); ++r) {
      if (!results[r].status.ok()) {
        std::cerr << "step " << step << " rank " << r << ": " << results[r].status.error_message()
                  << "\n";
        return 1;
      }
    }
  }
  return 0;
}

int DriveFaults(v1::Planner::Stub* stub, const std::string& job) {
  StepParams params;
  params.job_id = job;
  // A refused request: a negative length.
  params.step = kFaultSteps;
  auto refused = PlanConcurrently(stub, {MakeRequest(params, kRanks, 0, {-5})});
  if (refused[0].status.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
    std::cerr << "a negative length was not refused: " << refused[0].status.error_message() << "\n";
    return 1;
  }
  // A step only rank 0 asks for: it times out on the server.
  params.step = kFaultSteps + 1;
  auto lonely = PlanConcurrently(stub, {MakeRequest(params, kRanks, 0, {100})},
                                 absl::Seconds(30));
  if (lonely[0].status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::cerr << "a step with 7 missing ranks did not time out: "
              << lonely[0].status.error_message() << "\n";
    return 1;
  }
  return 0;
}

int DriveStranger(v1::Planner::Stub* stub, const std::string& job, uint64_t step) {
  StepParams params;
  params.job_id = job;
  params.step = step;
  params.topology = "g1n4";
  std::cout << "stranger: asking for step " << step << " of job " << job << std::endl;
  auto answer = PlanConcurrently(stub, {MakeRequest(params, 4, 0, {100})}, absl::Seconds(120));
  std::cout << "stranger: " << answer[0].status.error_code() << " "
            << answer[0].status.error_message() << std::endl;
  return 0;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  int port = 0, steps = 0;
  uint64_t stranger_step = 0;
  const bool faults = argc == 4 && std::string(argv[3]) == "faults";
  const bool stranger = argc == 5 && std::string(argv[3]) == "stranger" &&
                        absl::SimpleAtoi(argv[4], &stranger_step);
  if ((argc != 4 && !stranger) || !absl::SimpleAtoi(argv[1], &port) ||
      (!faults && !stranger && !absl::SimpleAtoi(argv[3], &steps))) {
    std::cerr << "usage: drive_planner PORT JOB STEPS|faults|stranger STEP\n";
    return 2;
  }
  auto stub = knapformer::v1::Planner::NewStub(knapformer::testing_util::LocalChannel(port));
  if (stranger) return knapformer::DriveStranger(stub.get(), argv[2], stranger_step);
  return faults ? knapformer::DriveFaults(stub.get(), argv[2])
                : knapformer::DriveSteps(stub.get(), argv[2], steps);
}
