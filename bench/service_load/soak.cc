#include "bench/service_load/soak.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sample_stats.h"

namespace knapformer {
namespace service_load {
namespace {

// The soak: one group stepping without pause for `minutes`; every `sample`
// the server's RSS, fds and CPU and the window's latency. Ends with the RSS
// at the end against its value at the first sample (after the warm-up).
Outcome Soak(LoadClient& client, ServerProcess& server, const Problem& problem,
             int64_t minutes, int64_t sample_seconds) {
  const std::string job_id = absl::StrCat("service-soak-r", problem.ranks);
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::minutes(minutes);
  Clock::time_point next_sample = start + std::chrono::seconds(sample_seconds);
  std::vector<double> window_ms;
  std::optional<double> cpu_before = server.CpuSeconds();
  int64_t warm_rss = -1, last_rss = -1, max_rss = -1;
  std::printf("\n| minute | steps | p50 (ms) | p99 (ms) | server CPU (%%) | RSS (MiB) "
              "| open fds |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  for (uint64_t step = 0;; ++step) {
    auto calls = std::make_unique<StepCalls>(static_cast<size_t>(problem.ranks));
    BuildRequests(problem, job_id, step, *calls);
    StepResult result = client.Run(*calls, step);
    if (!result.all_done) {
      (void)calls.release();  // gRPC may still write into them
      return Outcome::kStuck;
    }
    if (result.failed > 0 || result.wrong_answer > 0) {
      ReportStep(problem.ranks, step, result);
      return Outcome::kFailed;
    }
    window_ms.push_back(result.latency_ms);
    const Clock::time_point now = Clock::now();
    if (now < next_sample && now < end) continue;
    const std::optional<double> cpu_now = server.CpuSeconds();
    const double seconds = std::chrono::duration<double>(now - start).count();
    last_rss = server.RssBytes();
    if (warm_rss < 0) warm_rss = last_rss;
    max_rss = std::max(max_rss, last_rss);
    std::printf("| %.1f | %llu | %.2f | %.2f | %.1f | %.1f | %d |\n", seconds / 60,
                static_cast<unsigned long long>(step + 1), Percentile(window_ms, 0.5),
                Percentile(window_ms, 0.99),
                cpu_before && cpu_now ? 100.0 * (*cpu_now - *cpu_before) / sample_seconds : -1.0,
                last_rss / 1048576.0, server.OpenFds());
    std::fflush(stdout);
    window_ms.clear();
    cpu_before = cpu_now;
    next_sample += std::chrono::seconds(sample_seconds);
    if (now >= end) break;
  }
  std::printf("\nRSS at the first sample %.1f MiB, at the end %.1f MiB (%+.1f%%), "
              "largest %.1f MiB\n",
              warm_rss / 1048576.0, last_rss / 1048576.0,
              100.0 * (static_cast<double>(last_rss) / static_cast<double>(warm_rss) - 1),
              max_rss / 1048576.0);
  return Outcome::kOk;
}

}  // namespace

Outcome RunSoak(LoadClient& client, ServerProcess& server, const Problem& problem,
                int64_t minutes, int64_t sample_seconds) {
  std::printf("soak: %lld ranks, %lld minutes\n", static_cast<long long>(problem.ranks),
              static_cast<long long>(minutes));
  return Soak(client, server, problem, minutes, sample_seconds);
}

}  // namespace service_load
}  // namespace knapformer
