#include "bench/service_load/overload.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/service_load/format.h"
#include "bench/service_load/settings.h"
#include "common/sample_stats.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "server/service_limits.h"

namespace knapformer {
namespace service_load {
namespace {

// Stray Plan requests, each opening a step of a 2-rank group that never
// completes: they hold pending steps (and jobs) until their deadline.
class Flood {
 public:
  Flood(int port, int64_t requests, int64_t job_ids, int64_t into_one_job)
      : calls_(requests + into_one_job) {
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Planner::NewStub(channel_);
    for (int64_t i = 0; i < static_cast<int64_t>(calls_.size()); ++i) {
      v1::PlanRequest& request = calls_[i].request;
      v1::StepSpec* spec = request.mutable_spec();
      const bool one_job = i >= requests;
      spec->set_job_id(one_job ? "flood-one" : absl::StrCat("flood-", i % job_ids));
      spec->set_step(one_job ? i : i / job_ids);
      spec->set_world_size(2);
      spec->set_topology("g1n2");
      spec->set_d_model(kDModel);
      spec->set_gamma(kGamma);
      request.set_rank(0);
      request.add_sequence_lengths(1000);
    }
  }

  // Sends every request; each waits at most `deadline`.
  void Send(absl::Duration deadline) {
    const auto until = absl::ToChronoTime(absl::Now() + deadline);
    for (Call& call : calls_) {
      call.context.set_deadline(until);
      stub_->async()->Plan(&call.context, &call.request, &call.response,
                           [this, &call](grpc::Status status) {
                             absl::MutexLock lock(&mu_);
                             ++codes_[static_cast<int>(status.error_code())];
                             ++done_;
                           });
    }
  }

  // Waits (bounded) for every answer; false if some never came.
  bool Wait(absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == calls_.size(); };
    return mu_.AwaitWithTimeout(absl::Condition(&all), bound);
  }

  std::string Codes() {
    absl::MutexLock lock(&mu_);
    std::string out;
    for (const auto& [code, count] : codes_) {
      absl::StrAppend(&out, out.empty() ? "" : ", ", CodeName(code), " ", count);
    }
    return out;
  }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::PlanRequest request;
    v1::PlanResponse response;
  };
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Planner::Stub> stub_;
  std::vector<Call> calls_;
  absl::Mutex mu_;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int64_t> codes_ ABSL_GUARDED_BY(mu_);
};

// The overload: one good group steps before, during and after a flood of
// ten times the server's pending-step limit over ten times its job limit
// (and ten times the per-job limit into one job). Prints the good group's
// latency and failures, the flood's answers by code, and the server's RSS.
Outcome Overload(LoadClient& client, ServerProcess& server, const Problem& problem, int port) {
  const ServiceLimits limits;
  const std::string job_id = absl::StrCat("service-overload-r", problem.ranks);
  uint64_t step = 0;
  std::printf("\n| phase | good steps | good p50 (ms) | good p99 (ms) | good failed calls "
              "| server RSS (MiB) | open fds |\n|---|---:|---:|---:|---:|---:|---:|\n");
  auto phase = [&](const char* name, int steps) {
    std::vector<double> ms;
    int64_t failed = 0;
    std::map<int, int64_t> codes;
    for (int i = 0; i < steps; ++i, ++step) {
      auto calls = std::make_unique<StepCalls>(static_cast<size_t>(problem.ranks));
      BuildRequests(problem, job_id, step, *calls);
      StepResult result = client.Run(*calls, step);
      if (!result.all_done) {
        (void)calls.release();
        return false;
      }
      failed += result.failed;
      for (const auto& [code, count] : result.codes) codes[code] += count;
      ms.push_back(result.latency_ms);
    }
    std::string failures = absl::StrCat(failed);
    for (const auto& [code, count] : codes) absl::StrAppend(&failures, " ", CodeName(code));
    std::printf("| %s | %d | %.2f | %.2f | %s | %.1f | %d |\n", name, steps, Percentile(ms, 0.5),
                Percentile(ms, 0.99), failures.c_str(), server.RssBytes() / 1048576.0,
                server.OpenFds());
    std::fflush(stdout);
    return true;
  };
  if (!phase("before", 30)) return Outcome::kStuck;
  Flood flood(port, 10 * int64_t{limits.max_pending_steps}, 10 * int64_t{limits.max_jobs},
              10 * int64_t{limits.max_pending_steps_per_job});
  flood.Send(absl::Seconds(20));
  absl::SleepFor(absl::Seconds(2));  // every stray request has arrived
  if (!phase("during the flood", 30)) return Outcome::kStuck;
  const bool answered = flood.Wait(absl::Seconds(60));
  if (!phase("after it", 30)) return Outcome::kStuck;
  std::printf("\nflood: %lld requests over %lld job ids and %lld into one job; answers: %s%s\n",
              static_cast<long long>(10 * int64_t{limits.max_pending_steps}),
              static_cast<long long>(10 * int64_t{limits.max_jobs}),
              static_cast<long long>(10 * int64_t{limits.max_pending_steps_per_job}),
              flood.Codes().c_str(), answered ? "" : " (some never answered)");
  return answered ? Outcome::kOk : Outcome::kFailed;
}

}  // namespace

Outcome RunOverload(LoadClient& client, ServerProcess& server, const Problem& problem) {
  std::printf("overload: %lld ranks\n", static_cast<long long>(problem.ranks));
  return Overload(client, server, problem, server.port());
}

}  // namespace service_load
}  // namespace knapformer
