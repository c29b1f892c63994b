#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_LOAD_CLIENT_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_LOAD_CLIENT_H_

// The load client: every rank of one group played over kChannels channels
// (TCP connections) with gRPC's callback API, one step at a time (R Plan
// calls in flight, every answer awaited, each wait bounded), and how a
// step, and a run of steps, ended.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"

namespace knapformer {
namespace service_load {

using Clock = std::chrono::steady_clock;

// One step: R calls in flight, answered through callbacks.
struct StepCalls {
  explicit StepCalls(size_t ranks)
      : requests(ranks), responses(ranks), contexts(ranks), statuses(ranks) {}

  std::vector<v1::PlanRequest> requests;
  std::vector<v1::PlanResponse> responses;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<grpc::Status> statuses;  // written by each call's callback

  absl::Mutex mu;
  size_t done ABSL_GUARDED_BY(mu) = 0;
  Clock::time_point last_answer ABSL_GUARDED_BY(mu);
};

struct StepResult {
  bool all_done = false;  // false: calls still in flight, nothing may be freed
  double latency_ms = 0;
  int64_t failed = 0;
  std::map<int, int64_t> codes;          // failed calls by status code
  std::map<int, std::string> first_msg;  // first message per code
  int64_t wrong_answer = 0;              // OK, but rank or step not the one asked
  std::string first_wrong;
  int64_t plan_micros = -1;  // server-reported solve time
};

// How a scenario's steps ended. kStuck: calls are still in flight (their
// buffers cannot be freed), the run must end at once.
enum class Outcome { kOk, kFailed, kStuck };

class LoadClient {
 public:
  explicit LoadClient(int port);

  // False (after printing why) unless every channel connects in time.
  bool Connect();

  // Sends every request of `calls` (already built), waits for every answer.
  StepResult Run(StepCalls& calls, uint64_t step);

 private:
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Planner::Stub>> stubs_;
};

// Reports a step with failed calls or wrong answers on stderr.
void ReportStep(int64_t ranks, uint64_t step, const StepResult& result);

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_LOAD_CLIENT_H_
