// Writes the binary seed corpora of the request and response fuzzers: real
// Plan and PlanGroup requests, real answers with the rank header
// plan_response_fuzzer expects, and the costliest requests per byte for the
// wire scan. Usage: make_seeds DIR (DIR/corpus/NAME/..., which must exist).
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/rank_report.h"
#include "client/rank_report.pb.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/balancer.h"
#include "planner/plan_fingerprint.h"
#include "planner/topology.h"
#include "proto/mask_proto.h"
#include "proto/plan_proto.h"
#include "server/request_bounds.h"
#include "tests/fuzz/seed_lengths.h"
#include "tests/server/costly_requests.h"

namespace knapformer {
namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string ReadSeed(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

v1::StepSpec Spec(const std::string& topology, int32_t world_size) {
  v1::StepSpec spec;
  spec.set_job_id("seed");
  spec.set_step(3);
  spec.set_world_size(world_size);
  spec.set_topology(topology);
  spec.set_d_model(64);
  spec.set_gamma(0.5);
  spec.set_incarnation(0x5eed);
  return spec;
}

RankLengths Lengths(int32_t world_size, int seed) { return SeedLengths(world_size, seed); }

// One mask of every kind in turn, spans cut in three.
RankMasks MasksOf(const RankLengths& lengths) {
  RankMasks masks(lengths.size());
  int turn = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    for (int64_t l : lengths[r]) {
      switch (turn++ % 4) {
        case 0:
          masks[r].push_back(AttentionMask::Causal());
          break;
        case 1:
          masks[r].push_back(AttentionMask::Window(1 + l / 4));
          break;
        case 2:
          masks[r].push_back(l < 3 ? AttentionMask::Full()
                                   : AttentionMask::Spans({{l / 3, true},
                                                           {l / 3, false},
                                                           {l - 2 * (l / 3), true}}));
          break;
        default:
          masks[r].push_back(AttentionMask::Full());
      }
    }
  }
  return masks;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  using namespace knapformer;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  struct Case {
    std::string topology;
    int32_t world_size;
    v1::CostModel cost;
    v1::Locality locality;
    int64_t cap;
  };
  const std::vector<Case> cases = {
      {"g1n2+g2n1+g4n1", 8, v1::COST_MODEL_TRANSFORMER, v1::LOCALITY_PLANNER_DEFAULT, 0},
      {"g1n4", 8, v1::COST_MODEL_LINEAR, v1::LOCALITY_OFF, 0},
      {"g2n2", 4, v1::COST_MODEL_UNIFORM, v1::LOCALITY_ON, 0},
      {"g4n1+g1n4", 16, v1::COST_MODEL_TRANSFORMER, v1::LOCALITY_ON, 600},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    v1::StepSpec spec = Spec(k.topology, k.world_size);
    spec.set_cost_model(k.cost);
    spec.set_locality(k.locality);
    spec.set_max_tokens_per_gpu(k.cap);
    const RankLengths lengths = Lengths(k.world_size, static_cast<int>(c));
    v1::PlanRequest request;
    *request.mutable_spec() = spec;
    request.set_rank(static_cast<int32_t>(c) % k.world_size);
    for (int64_t l : lengths[request.rank()]) request.add_sequence_lengths(l);
    Write(absl::StrCat(dir, "/corpus/plan_request_fuzzer/seed_", c), request.SerializeAsString());
    v1::PlanGroupRequest group;
    *group.mutable_spec() = spec;
    for (const auto& rank : lengths) {
      group.add_ranks()->mutable_sequence_lengths()->Add(rank.begin(), rank.end());
    }
    Write(absl::StrCat(dir, "/corpus/plan_group_request_fuzzer/seed_", c),
          group.SerializeAsString());
  }
  // A masked step: every kind of mask, on every rank.
  {
    const v1::StepSpec spec = Spec("g1n2+g2n1+g4n1", 8);
    const RankLengths lengths = Lengths(8, 4);
    const RankMasks masks = MasksOf(lengths);
    v1::PlanGroupRequest group;
    *group.mutable_spec() = spec;
    for (int32_t r = 0; r < 8; ++r) {
      v1::RankLengths* rank = group.add_ranks();
      rank->mutable_sequence_lengths()->Add(lengths[r].begin(), lengths[r].end());
      for (const AttentionMask& mask : masks[r]) MaskToProto(mask, rank->add_attention_masks());
      if (r != 5) continue;
      v1::PlanRequest request;
      *request.mutable_spec() = spec;
      request.set_rank(r);
      *request.mutable_sequence_lengths() = rank->sequence_lengths();
      *request.mutable_attention_masks() = rank->attention_masks();
      Write(absl::StrCat(dir, "/corpus/plan_request_fuzzer/masks"), request.SerializeAsString());
    }
    Write(absl::StrCat(dir, "/corpus/plan_group_request_fuzzer/masks"),
          group.SerializeAsString());
  }
  // Answers of an 8-rank g1n2+g2n1+g4n1 world, one seed per rank.
  const World world = *World::Create(*Topology::Parse("g1n2+g2n1+g4n1"), 8);
  for (int seed = 0; seed < 2; ++seed) {
    const RankLengths lengths = Lengths(8, seed);
    const Plan plan = *BalanceGreedy(world, *CostModel::Create(64, 0.5), lengths);
    for (int32_t r = 0; r < 8; ++r) {
      std::string bytes(1, static_cast<char>(r | (lengths[r].size() << 3)));
      for (int64_t l : lengths[r]) bytes.push_back(static_cast<char>(l));
      v1::PlanResponse response;
      response.set_job_id("seed");
      response.set_step(3);
      RankPlanToProto(plan.Slice(r), response.mutable_plan());
      *response.mutable_balance() = BalanceToProto(plan, 128, 10);
      bytes += response.SerializeAsString();
      Write(absl::StrCat(dir, "/corpus/plan_response_fuzzer/seed_", seed, "_rank_", r), bytes);
    }
  }
  // Group answers (plan_group_response_fuzzer): the header byte picks the
  // lengths, then the service's answer to them.
  for (int seed = 0; seed < 4; ++seed) {
    const RankLengths lengths = Lengths(8, seed);
    const Plan plan = *BalanceGreedy(world, *CostModel::Create(64, 0.5), lengths);
    v1::PlanGroupResponse response;
    response.set_job_id("seed");
    response.set_step(3);
    *response.mutable_balance() = BalanceToProto(plan, 128, 10);
    ChunksToProto(plan, response.mutable_chunks());
    response.mutable_workload_before()->Add(plan.workload_before.begin(),
                                            plan.workload_before.end());
    response.mutable_workload_after()->Add(plan.workload_after.begin(), plan.workload_after.end());
    Write(absl::StrCat(dir, "/corpus/plan_group_response_fuzzer/seed_", seed),
          std::string(1, static_cast<char>(seed)) + response.SerializeAsString());
  }
  // Rank reports (rank_reports_fuzzer): 8 ranks' reports of a Plan, and 8
  // ranks' per-rank outcomes carrying their slices' fingerprints.
  {
    const v1::StepSpec spec = Spec("g1n2+g2n1+g4n1", 8);
    const RankLengths lengths = Lengths(8, 1);
    const Plan plan = *BalanceGreedy(world, *CostModel::Create(64, 0.5), lengths);
    std::string reports(1, static_cast<char>(7));
    std::string outcomes(1, static_cast<char>(7));
    for (int32_t r = 0; r < 8; ++r) {
      const client::RankReport report =
          ReportOf(client::RankReport::PLAN, spec, lengths[r], {}, nullptr, absl::OkStatus(), true);
      const std::string bytes = report.SerializeAsString();
      if (bytes.size() > 255) return 1;
      reports += static_cast<char>(bytes.size()) + bytes;
      client::RankReport in_step;
      in_step.set_call(client::RankReport::PLAN);
      *in_step.mutable_spec() = ComparedSpec(spec);
      client::StepOutcome* outcome = in_step.mutable_outcome();
      *outcome->mutable_fingerprint() = FingerprintToProto(FingerprintOf(plan.Slice(r), {}));
      const std::string outcome_bytes = in_step.SerializeAsString();
      if (outcome_bytes.size() > 255) return 1;
      outcomes += static_cast<char>(outcome_bytes.size()) + outcome_bytes;
    }
    Write(absl::StrCat(dir, "/corpus/rank_reports_fuzzer/plan"), reports);
    Write(absl::StrCat(dir, "/corpus/rank_reports_fuzzer/outcomes"), outcomes);
  }
  // The wire scan's (request_scan_fuzzer): the header byte picks the
  // request message; every field's costliest form, and the masked step.
  {
    const auto& requests = ScannedRequests();
    auto kind = [&](const google::protobuf::Descriptor* request) {
      return std::string(
          1, static_cast<char>(std::find(requests.begin(), requests.end(), request) -
                               requests.begin()));
    };
    int i = 0;
    for (const testing_util::CostlyRequest& c : testing_util::CostlyRequests(64)) {
      Write(absl::StrCat(dir, "/corpus/request_scan_fuzzer/costly_", i++),
            kind(c.request) + c.bytes);
    }
    const std::string masked =
        ReadSeed(absl::StrCat(dir, "/corpus/plan_group_request_fuzzer/masks"));
    Write(absl::StrCat(dir, "/corpus/request_scan_fuzzer/masks"),
          kind(v1::PlanGroupRequest::descriptor()) + masked);
  }
  return 0;
}
