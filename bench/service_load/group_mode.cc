#include "bench/service_load/group_mode.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/service_load/format.h"
#include "bench/service_load/problem.h"
#include "bench/service_load/settings.h"
#include "common/sample_stats.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "planner/plan_from_chunks.h"
#include "proto/plan_proto.h"
#include "server/request_scan.h"
#include "server/service_limits.h"

namespace knapformer {
namespace service_load {
namespace {

// Group mode (PlannerClient's default): one PlanGroup request with every
// rank's lengths, its answer serialized (rank 0's broadcast), parsed and
// rebuilt into a plan (what every other rank does, in parallel) and one
// rank's slice taken. The gather before it is not included.
struct GroupRow {
  int64_t ranks = 0;
  int64_t steps = 0;
  std::vector<double> step_ms;
  std::vector<double> rpc_ms, serialize_ms, rebuild_ms;
  double core_solve_ms = NAN;
  double server_cpu_ms_per_step = NAN;
  double request_kib = NAN, answer_kib = NAN;
  double server_peak_mib = NAN;  // the server child's peak RSS after the steps
  // What the server charges the request against its memory limits before
  // parsing it (EstimatedParsedBytes), MiB.
  double charged_mib = NAN;
  int64_t failed = 0;
};

bool MeasureGroup(int port, ServerProcess& server, const Problem& problem, int64_t steps,
                  int64_t warmup, GroupRow* row) {
  row->ranks = problem.ranks;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto stub = v1::Planner::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  const std::string job_id = absl::StrCat("service-load-bench-group-r", problem.ranks);
  std::optional<double> cpu_start;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    const bool measured = step >= warmup;
    const RankLengths lengths = problem.stream.Batch(step);
    v1::PlanGroupRequest request;
    *request.mutable_spec() = StepSpecOf(problem, job_id, static_cast<uint64_t>(step));
    for (const std::vector<int64_t>& rank : lengths) {
      request.add_ranks()->mutable_sequence_lengths()->Add(rank.begin(), rank.end());
    }
    if (measured && step == warmup) cpu_start = server.CpuSeconds();
    const Clock::time_point start = Clock::now();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::PlanGroupResponse response;
    const grpc::Status status = stub->PlanGroup(&context, request, &response);
    const Clock::time_point answered = Clock::now();
    if (!status.ok()) {
      std::fprintf(stderr, "R=%lld group step %lld: %s\n", static_cast<long long>(problem.ranks),
                   static_cast<long long>(step), status.error_message().c_str());
      ++row->failed;
      return false;
    }
    const std::string broadcast = response.SerializeAsString();
    v1::PlanGroupResponse received;
    const bool parsed = received.ParseFromString(broadcast);
    const Clock::time_point deserialized = Clock::now();
    absl::StatusOr<std::vector<Chunk>> chunks = ChunksFromProto(received.chunks());
    absl::StatusOr<Plan> plan =
        chunks.ok() ? PlanFromChunks(problem.world, problem.cost, lengths, *std::move(chunks))
                    : absl::StatusOr<Plan>(chunks.status());
    const RankPlan slice = plan.ok() ? plan->Slice(static_cast<int32_t>(problem.ranks - 1))
                                     : RankPlan();
    const Clock::time_point rebuilt = Clock::now();
    if (!parsed || !plan.ok()) {
      std::fprintf(stderr, "R=%lld group step %lld: the answer does not rebuild: %s\n",
                   static_cast<long long>(problem.ranks), static_cast<long long>(step),
                   plan.ok() ? "parse failed" : plan.status().ToString().c_str());
      ++row->failed;
      return false;
    }
    if (!measured) continue;
    if (step == warmup) {
      const std::string wire = request.SerializeAsString();
      google::protobuf::io::ArrayInputStream input(wire.data(), static_cast<int>(wire.size()));
      const absl::StatusOr<RequestShape> shape =
          RequestScanner(ServiceLimits()).Scan(v1::PlanGroupRequest::descriptor(), &input);
      if (shape.ok()) {
        row->charged_mib = static_cast<double>(EstimatedParsedBytes(*shape)) / 1048576.0;
      }
      row->request_kib = static_cast<double>(request.ByteSizeLong()) / 1024.0;
      row->answer_kib = static_cast<double>(broadcast.size()) / 1024.0;
    }
    auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    row->step_ms.push_back(ms(start, rebuilt));
    row->rpc_ms.push_back(ms(start, answered));
    row->serialize_ms.push_back(ms(answered, deserialized));
    row->rebuild_ms.push_back(ms(deserialized, rebuilt));
    ++row->steps;
    (void)slice;
  }
  const std::optional<double> cpu_end = server.CpuSeconds();
  if (cpu_start && cpu_end && row->steps > 0) {
    row->server_cpu_ms_per_step = 1000.0 * (*cpu_end - *cpu_start) / row->steps;
  }
  row->server_peak_mib = static_cast<double>(server.PeakRssBytes()) / 1048576.0;
  const absl::StatusOr<double> solve_ms = CoreSolveMs(problem, warmup, row->steps);
  if (!solve_ms.ok()) return false;
  row->core_solve_ms = *solve_ms;
  return true;
}

void PrintGroupRow(const GroupRow& row, double per_rank_server_cpu_ms) {
  std::printf(
      "| %lld | %lld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
              static_cast<long long>(row.ranks), static_cast<long long>(row.steps),
              Fixed(Percentile(row.step_ms, 0.5), 2).c_str(),
              Fixed(Percentile(row.step_ms, 0.99), 2).c_str(),
              Fixed(row.core_solve_ms, 2).c_str(),
              Fixed(Percentile(row.step_ms, 0.5) / row.core_solve_ms, 2).c_str(),
              Fixed(Median(row.rpc_ms), 2).c_str(), Fixed(Median(row.serialize_ms), 2).c_str(),
              Fixed(Median(row.rebuild_ms), 2).c_str(),
              Fixed(row.server_cpu_ms_per_step, 2).c_str(),
              Fixed(per_rank_server_cpu_ms / row.server_cpu_ms_per_step, 1).c_str(),
              Fixed(row.request_kib, 0).c_str(), Fixed(row.charged_mib, 1).c_str(),
              Fixed(row.answer_kib, 0).c_str(), Fixed(row.server_peak_mib, 0).c_str(),
              row.failed > 0 ? "yes" : "no");
  std::fflush(stdout);
}

}  // namespace

bool RunGroupModeTable(const Flags& flags, const PerRankRun& per_rank, ServerProcess& server) {
  std::printf(
      "\ngroup mode (one PlanGroup per step; the ranks' all-gather before it not "
      "included):\n\n"
      "| ranks | steps | step p50 (ms) | step p99 (ms) | core solve p50 (ms) "
      "| step / solve | RPC p50 (ms) | serialize + parse p50 (ms) "
      "| rebuild + slice p50 (ms) | server CPU/step (ms) | per-rank server CPU / group's "
      "| request KiB | charged MiB | answer KiB | server peak RSS MiB | failed |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  bool ok = true;
  for (const Problem& problem : per_rank.problems) {
    GroupRow row;
    if (!MeasureGroup(server.port(), server, problem, StepsAt(flags, problem.ranks),
                      flags.warmup, &row)) {
      ok = false;
    }
    const auto per_rank_cpu = per_rank.server_cpu_per_step.find(problem.ranks);
    PrintGroupRow(row, per_rank_cpu == per_rank.server_cpu_per_step.end() ? NAN
                                                                           : per_rank_cpu->second);
  }
  return ok;
}

}  // namespace service_load
}  // namespace knapformer
