#include "bench/service_load/load_client.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/service_load/format.h"
#include "bench/service_load/settings.h"

namespace knapformer {
namespace service_load {

LoadClient::LoadClient(int port) {
  const std::string target = absl::StrCat("127.0.0.1:", port);
  for (int i = 0; i < kChannels; ++i) {
    grpc::ChannelArguments args;
    // Distinct arguments: a channel of its own, hence a TCP connection of its own.
    args.SetInt(kChannelIndexArg, i);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    channels_.push_back(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
    stubs_.push_back(v1::Planner::NewStub(channels_.back()));
  }
}

bool LoadClient::Connect() {
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(kConnectWaitSeconds);
  for (int i = 0; i < kChannels; ++i) {
    if (!channels_[i]->WaitForConnected(deadline)) {
      std::fprintf(stderr, "channel %d did not connect within %d s\n", i, kConnectWaitSeconds);
      return false;
    }
  }
  return true;
}

StepResult LoadClient::Run(StepCalls& calls, uint64_t step) {
  const size_t n = calls.requests.size();
  const auto deadline =
      std::chrono::system_clock::now() + absl::ToChronoNanoseconds(kCallDeadline);
  for (size_t r = 0; r < n; ++r) {
    calls.contexts[r] = std::make_unique<grpc::ClientContext>();
    calls.contexts[r]->set_deadline(deadline);
  }
  StepCalls* const c = &calls;
  const Clock::time_point start = Clock::now();
  for (size_t r = 0; r < n; ++r) {
    stubs_[r % kChannels]->async()->Plan(calls.contexts[r].get(), &calls.requests[r],
                                         &calls.responses[r], [c, r, n](grpc::Status status) {
                                           c->statuses[r] = std::move(status);
                                           const Clock::time_point now = Clock::now();
                                           absl::MutexLock lock(&c->mu);
                                           if (++c->done == n) c->last_answer = now;
                                         });
  }

  StepResult result;
  auto all_done = [c, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) { return c->done == n; };
  {
    absl::MutexLock lock(&calls.mu);
    result.all_done = calls.mu.AwaitWithTimeout(absl::Condition(&all_done), kStepWait);
  }
  if (!result.all_done) {
    size_t done;
    {
      absl::MutexLock lock(&calls.mu);
      done = calls.done;
    }
    std::fprintf(stderr, "step %llu: only %zu of %zu answers after %s; cancelling the rest\n",
                 static_cast<unsigned long long>(step), done, n,
                 absl::FormatDuration(kStepWait).c_str());
    for (auto& context : calls.contexts) context->TryCancel();
    absl::MutexLock lock(&calls.mu);
    result.all_done = calls.mu.AwaitWithTimeout(absl::Condition(&all_done), kCancelWait);
    if (!result.all_done) return result;
  }
  {
    absl::MutexLock lock(&calls.mu);
    result.latency_ms =
        std::chrono::duration<double, std::milli>(calls.last_answer - start).count();
  }
  for (size_t r = 0; r < n; ++r) {
    const grpc::Status& status = calls.statuses[r];
    if (!status.ok()) {
      ++result.failed;
      const int code = static_cast<int>(status.error_code());
      if (result.codes[code]++ == 0) {
        result.first_msg[code] = absl::StrCat("rank ", r, ": ", status.error_message());
      }
      continue;
    }
    const v1::PlanResponse& response = calls.responses[r];
    if (response.plan().rank() != static_cast<int32_t>(r) || response.step() != step) {
      if (result.wrong_answer++ == 0) {
        result.first_wrong = absl::StrCat("rank ", r, " step ", step, " got plan.rank ",
                                          response.plan().rank(), " step ", response.step());
      }
      continue;
    }
    if (result.plan_micros < 0) result.plan_micros = response.balance().plan_micros();
  }
  return result;
}

void ReportStep(int64_t ranks, uint64_t step, const StepResult& result) {
  std::string codes;
  for (const auto& [code, count] : result.codes) {
    absl::StrAppend(&codes, codes.empty() ? "" : ", ", CodeName(code), " x", count,
                    " (first: ", result.first_msg.at(code), ")");
  }
  std::fprintf(stderr,
               "R=%lld step %llu: %lld failed calls%s%s; %lld wrong answers%s%s; "
               "step took %.1f ms\n",
               static_cast<long long>(ranks), static_cast<unsigned long long>(step),
               static_cast<long long>(result.failed), codes.empty() ? "" : ": ", codes.c_str(),
               static_cast<long long>(result.wrong_answer), result.first_wrong.empty() ? "" : ": ",
               result.first_wrong.c_str(), result.latency_ms);
  std::fflush(stderr);
}

}  // namespace service_load
}  // namespace knapformer
