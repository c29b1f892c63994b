#include "bench/service_load/problem.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bench/service_load/settings.h"
#include "common/sample_stats.h"
#include "planner/balancer.h"

namespace knapformer {
namespace service_load {
namespace {

int64_t BlockGpus(const std::vector<DataCode>& codes) {
  int64_t block = 0;
  for (const DataCode& code : codes) block += code.gpus;
  return block;
}

}  // namespace

absl::StatusOr<Problem> MakeProblem(const std::vector<DataCode>& codes, int64_t requested) {
  int64_t ranks = requested;
  // The topology g1n{R/2}+g2n{R/8}+g4n{R/16} needs R % 16 == 0; the stream a
  // multiple of its block. Both hold at multiples of lcm(block, 16).
  if (!DataStream::Create(codes, ranks, kStreamSeed).ok() || ranks % 16 != 0) {
    const int64_t block = BlockGpus(codes);
    int64_t unit = block;
    while (unit % 16 != 0) unit += block;
    ranks = std::max<int64_t>(unit, (requested + unit / 2) / unit * unit);
    while (ranks > kMaxWorldSize) ranks -= unit;
    std::fprintf(stderr, "note: %lld ranks is not valid for %s (multiples of %lld); using %lld\n",
                 static_cast<long long>(requested), kScenario, static_cast<long long>(unit),
                 static_cast<long long>(ranks));
    std::fflush(stderr);
  }
  auto stream = DataStream::Create(codes, ranks, kStreamSeed);
  if (!stream.ok()) return stream.status();
  const std::string spec = absl::StrCat("g1n", ranks / 2, "+g2n", ranks / 8, "+g4n", ranks / 16);
  auto topology = Topology::Parse(spec);
  if (!topology.ok()) return topology.status();
  auto world = World::Create(*topology, ranks);
  if (!world.ok()) return world.status();
  auto cost = CostModel::Create(kDModel, kGamma);
  if (!cost.ok()) return cost.status();
  return Problem{ranks, spec, *std::move(stream), *std::move(world), *cost};
}

v1::StepSpec StepSpecOf(const Problem& problem, const std::string& job_id, uint64_t step) {
  v1::StepSpec spec;
  spec.set_job_id(job_id);
  spec.set_step(step);
  spec.set_world_size(static_cast<int32_t>(problem.ranks));
  spec.set_topology(problem.topology);
  spec.set_d_model(kDModel);
  spec.set_gamma(kGamma);
  spec.set_token_bytes(kTokenBytes);
  return spec;
}

absl::StatusOr<double> CoreSolveMs(const Problem& problem, int64_t first, int64_t steps) {
  std::vector<double> solve_ms;
  for (int64_t i = 0; i < steps; ++i) {
    const RankLengths lengths = problem.stream.Batch(first + i);
    const Clock::time_point start = Clock::now();
    absl::StatusOr<Plan> plan = BalanceGreedy(problem.world, problem.cost, lengths);
    const Clock::time_point end = Clock::now();
    if (!plan.ok()) return plan.status();
    solve_ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  return Median(solve_ms);
}

void BuildRequests(const Problem& problem, const std::string& job_id, uint64_t step,
                   StepCalls& calls) {
  const RankLengths lengths = problem.stream.Batch(static_cast<int64_t>(step));
  const v1::StepSpec spec = StepSpecOf(problem, job_id, step);
  for (int64_t r = 0; r < problem.ranks; ++r) {
    v1::PlanRequest& request = calls.requests[r];
    *request.mutable_spec() = spec;
    request.set_rank(static_cast<int32_t>(r));
    request.mutable_sequence_lengths()->Add(lengths[r].begin(), lengths[r].end());
  }
}

}  // namespace service_load
}  // namespace knapformer
