#include "bench/service_load/per_rank.h"

#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/service_load/format.h"
#include "bench/service_load/settings.h"
#include "common/sample_stats.h"

namespace knapformer {
namespace service_load {
namespace {

double SelfCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct Row {
  int64_t requested = 0;  // as asked by --ranks (ranks may differ, see MakeProblem)
  int64_t ranks = 0;
  int64_t steps = 0;  // measured and completed
  std::vector<double> latency_ms;
  double server_cpu_ms_per_step = NAN;
  double client_cpu_ms_per_step = NAN;
  double core_solve_ms = NAN;
  std::vector<double> plan_ms;  // server-reported
  int64_t failed_calls = 0;
  bool aborted = false;
  double wire_kib_per_step = NAN;  // request + answer payloads, all ranks
};

// Server CPU per rank per call, microseconds.
double MicrosPerCall(const Row& row) {
  return 1000.0 * row.server_cpu_ms_per_step / static_cast<double>(row.ranks);
}

void PrintRow(const Row& row, const Row& bare) {
  double total_ms = 0;
  for (double ms : row.latency_ms) total_ms += ms;
  const double steps_per_s =
      row.latency_ms.empty() ? NAN : 1000.0 * static_cast<double>(row.latency_ms.size()) / total_ms;
  const std::string asked =
      row.requested != row.ranks ? absl::StrCat(" (asked ", row.requested, ")") : "";
  std::printf("| %lld%s | %lld%s | %s | %s | %s | %s | %s | %s | %s | %s | %lld | %s "
              "| %s | %s | %s | %s | %s |\n",
              static_cast<long long>(row.ranks), asked.c_str(), static_cast<long long>(row.steps),
              row.aborted ? " (aborted)" : "", Fixed(steps_per_s, 1).c_str(),
              Fixed(Percentile(row.latency_ms, 0.50), 2).c_str(),
              Fixed(Percentile(row.latency_ms, 0.99), 2).c_str(),
              Fixed(row.server_cpu_ms_per_step, 2).c_str(), Fixed(row.core_solve_ms, 3).c_str(),
              Fixed(row.server_cpu_ms_per_step / row.core_solve_ms, 1).c_str(),
              Fixed(row.client_cpu_ms_per_step, 2).c_str(), Fixed(Median(row.plan_ms), 3).c_str(),
              static_cast<long long>(row.failed_calls + bare.failed_calls),
              Fixed(row.wire_kib_per_step, 0).c_str(),
              Fixed(Percentile(bare.latency_ms, 0.50), 2).c_str(),
              Fixed(MicrosPerCall(row), 1).c_str(), Fixed(MicrosPerCall(bare), 1).c_str(),
              Fixed(MicrosPerCall(row) / MicrosPerCall(bare), 2).c_str(),
              Fixed(bare.wire_kib_per_step, 0).c_str());
  std::fflush(stdout);
}

// Measures one group size. kStuck: calls are still in flight (their buffers
// cannot be freed), the run must end at once.
Outcome MeasureRanks(LoadClient& client, ServerProcess& server, const Problem& problem,
                     int64_t steps, int64_t warmup, bool measure_core_solve, Row* row) {
  row->ranks = problem.ranks;
  const std::string job_id = absl::StrCat("service-load-bench-r", problem.ranks);
  const uint64_t total = static_cast<uint64_t>(warmup + steps);
  std::optional<double> server_cpu_start;
  double client_cpu_start = 0;
  Outcome outcome = Outcome::kOk;

  for (uint64_t step = 0; step < total; ++step) {
    const bool measured = step >= static_cast<uint64_t>(warmup);
    auto calls = std::make_unique<StepCalls>(static_cast<size_t>(problem.ranks));
    BuildRequests(problem, job_id, step, *calls);
    if (measured && step == static_cast<uint64_t>(warmup)) {
      server_cpu_start = server.CpuSeconds();
      client_cpu_start = SelfCpuSeconds();
    }
    StepResult result = client.Run(*calls, step);
    if (!result.all_done) {
      std::fprintf(stderr, "R=%lld step %llu: calls still in flight after cancelling\n",
                   static_cast<long long>(problem.ranks), static_cast<unsigned long long>(step));
      (void)calls.release();  // gRPC may still write into them
      row->aborted = true;
      return Outcome::kStuck;
    }
    if (result.failed > 0 || result.wrong_answer > 0) {
      ReportStep(problem.ranks, step, result);
      row->failed_calls += result.failed + result.wrong_answer;
      const std::string ended = server.ExitIfEnded();
      if (!ended.empty()) {
        std::fprintf(stderr, "R=%lld step %llu: server child %s\n",
                     static_cast<long long>(problem.ranks), static_cast<unsigned long long>(step),
                     ended.c_str());
      }
      row->aborted = true;
      outcome = Outcome::kFailed;
      break;
    }
    if (measured && step == static_cast<uint64_t>(warmup)) {
      size_t bytes = 0;
      for (size_t r = 0; r < calls->requests.size(); ++r) {
        bytes += calls->requests[r].ByteSizeLong() + calls->responses[r].ByteSizeLong();
      }
      row->wire_kib_per_step = static_cast<double>(bytes) / 1024.0;
    }
    if (measured) {
      row->latency_ms.push_back(result.latency_ms);
      if (result.plan_micros >= 0) row->plan_ms.push_back(1e-3 * result.plan_micros);
      ++row->steps;
    }
  }

  if (row->steps > 0) {
    const std::optional<double> server_cpu_end = server.CpuSeconds();
    const double client_cpu_end = SelfCpuSeconds();
    if (server_cpu_start && server_cpu_end) {
      row->server_cpu_ms_per_step =
          1000.0 * (*server_cpu_end - *server_cpu_start) / static_cast<double>(row->steps);
    }
    row->client_cpu_ms_per_step =
        1000.0 * (client_cpu_end - client_cpu_start) / static_cast<double>(row->steps);

    if (!measure_core_solve) return outcome;
    // The planner core on the same batches.
    const absl::StatusOr<double> solve_ms = CoreSolveMs(problem, warmup, row->steps);
    if (solve_ms.ok()) {
      row->core_solve_ms = *solve_ms;
    } else {
      std::fprintf(stderr, "R=%lld: BalanceGreedy: %s\n", static_cast<long long>(problem.ranks),
                   solve_ms.status().ToString().c_str());
    }
  }
  return outcome;
}

}  // namespace

Outcome RunPerRankTable(const Flags& flags, const std::vector<DataCode>& codes,
                        LoadClient& client, ServerProcess& server, LoadClient& bare_client,
                        ServerProcess& bare_server, PerRankRun* run) {
  std::printf(
      "\nper-rank mode, and a bare gRPC rendezvous (pid %d: same Plan RPC, every call "
      "held until the step's last rank asks, answered with %d bytes of filler, no "
      "plan) measured right before it at each R:\n\n"
      "| ranks | steps | steps/s | p50 (ms) | p99 (ms) | server CPU/step (ms) "
      "| core solve p50 (ms) | server CPU / solve | client CPU/step (ms) "
      "| server plan_micros p50 (ms) | failed calls | wire KiB/step "
      "| bare p50 (ms) | server CPU per call (us) | bare server CPU per call (us) "
      "| per call / bare | bare wire KiB/step |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
      static_cast<int>(bare_server.pid()), kBareReplyPaddingBytes);
  std::fflush(stdout);
  Outcome worst = Outcome::kOk;
  for (const int64_t requested : flags.ranks) {
    const std::string ended = server.ExitIfEnded();
    if (!ended.empty()) {
      std::fprintf(stderr, "server child %s; stopping\n", ended.c_str());
      return Outcome::kFailed;
    }
    absl::StatusOr<Problem> problem = MakeProblem(codes, requested);
    if (!problem.ok()) {
      std::fprintf(stderr, "R=%lld: %s\n", static_cast<long long>(requested),
                   problem.status().ToString().c_str());
      worst = Outcome::kFailed;
      continue;
    }
    const int64_t steps = StepsAt(flags, problem->ranks);
    Row bare;
    bare.requested = requested;
    Outcome outcome = MeasureRanks(bare_client, bare_server, *problem, steps, flags.warmup,
                                   /*measure_core_solve=*/false, &bare);
    Row row;
    row.requested = requested;
    if (outcome == Outcome::kOk) {
      outcome = MeasureRanks(client, server, *problem, steps, flags.warmup,
                             /*measure_core_solve=*/true, &row);
    }
    PrintRow(row, bare);
    run->server_cpu_per_step[problem->ranks] = row.server_cpu_ms_per_step;
    run->problems.push_back(*std::move(problem));
    // Calls in flight still point into this process's buffers: the caller
    // ends at once.
    if (outcome == Outcome::kStuck) return outcome;
    if (outcome != Outcome::kOk) worst = Outcome::kFailed;
  }
  return worst;
}

}  // namespace service_load
}  // namespace knapformer
