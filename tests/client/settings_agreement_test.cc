// Every rank of a balancer must be created with the same settings: the
// disagreement a rank configured differently causes is named (setting,
// values, ranks), and SequenceBalancer::Create fails on every rank at once
// instead of hanging them in other subgroups or other steps.
#include "client/settings_agreement.h"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/sequence_balancer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/gloo_world.h"

namespace knapformer {
namespace {

using testing::HasSubstr;
using testing_util::RegisterScenario;
using testing_util::RunWorkers;
using testing_util::Worker;
using testing_util::WorkerRun;

SequenceBalancerOptions Base() {
  SequenceBalancerOptions options;
  options.topology = "g1n2+g2n1";
  options.d_model = 64;
  options.gamma = 0.49;
  return options;
}

// The settings of `size` ranks, the last one changed by `change`.
std::vector<std::string> WithLastRank(int size,
                                      const std::function<void(SequenceBalancerOptions&)>& change) {
  std::vector<std::string> encoded;
  for (int r = 0; r < size; ++r) {
    SequenceBalancerOptions options = Base();
    if (r == size - 1) change(options);
    encoded.push_back(EncodeSettings(SharedSettingsOf(options)));
  }
  return encoded;
}

TEST(SettingsAgreement, TheSameSettingsAgree) {
  EXPECT_EQ(SettingsDisagreement(WithLastRank(4, [](SequenceBalancerOptions&) {})), "");
  EXPECT_TRUE(CheckSettingsAgree(WithLastRank(1, [](SequenceBalancerOptions&) {})).ok());
}

struct Case {
  std::string field;
  std::function<void(SequenceBalancerOptions&)> change;
  std::string named;  // the values and ranks, as the message names them
};

TEST(SettingsAgreement, EverySharedSettingThatDiffersIsNamed) {
  const std::vector<Case> cases = {
      {"topology", [](auto& o) { o.topology = "g1n4"; },
       "'g1n4' on rank 3 but 'g1n2+g2n1' on ranks 0-2"},
      {"d_model", [](auto& o) { o.d_model = 128; }, "'128' on rank 3 but '64' on ranks 0-2"},
      {"gamma", [](auto& o) { o.gamma = 1.0; }, "'1' on rank 3"},
      {"cost_model", [](auto& o) { o.cost_model = CostKind::kUniform; }, "'uniform' on rank 3"},
      {"locality", [](auto& o) { o.locality = false; }, "'off' on rank 3"},
      {"max_tokens_per_gpu", [](auto& o) { o.max_tokens_per_gpu = 100; }, "'100' on rank 3"},
      {"planner_address", [](auto& o) { o.planner.address = "planner:50051"; },
       "'planner:50051' on rank 3 but '' on ranks 0-2"},
      {"planner_mode", [](auto& o) { o.planner.mode = PlannerMode::kPerRank; },
       "'per-rank' on rank 3"},
      {"require_planner", [](auto& o) { o.planner.require_service = true; }, "'true' on rank 3"},
      {"job_id", [](auto& o) { o.job_id = "other"; }, "'other' on rank 3"},
      {"group_id", [](auto& o) { o.group_id = "g"; }, "'g' on rank 3"},
      {"first_step", [](auto& o) { o.first_step = 9; }, "'9' on rank 3"},
      {"use_fitted_gamma", [](auto& o) { o.use_fitted_gamma = true; }, "'true' on rank 3"},
      {"agree_on_errors", [](auto& o) { o.agree_on_errors = false; }, "'false' on rank 3"},
      {"machine.gpus_per_node", [](auto& o) { o.machine.gpus_per_node = 4; }, "'4' on rank 3"},
      {"machine.inter_node_bytes_per_second",
       [](auto& o) { o.machine.inter_node_bytes_per_second = 25e9; }, "'25000000000' on rank 3"},
  };
  for (const Case& c : cases) {
    const absl::Status status = CheckSettingsAgree(WithLastRank(4, c.change));
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << c.field;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("settings differ: ", c.field, " is ", c.named)))
        << status;
  }
}

TEST(SettingsAgreement, RanksAreListedAsRunsMinorityFirst) {
  std::vector<std::string> encoded;
  for (int r = 0; r < 8; ++r) {
    SequenceBalancerOptions options = Base();
    if (r == 2 || r == 5 || r == 6) options.topology = "g8n1";
    encoded.push_back(EncodeSettings(SharedSettingsOf(options)));
  }
  EXPECT_EQ(SettingsDisagreement(encoded),
            "topology is 'g8n1' on ranks 2, 5-6 but 'g1n2+g2n1' on ranks 0-1, 3-4, 7");
}

TEST(SettingsAgreement, ValuesWithNewlinesAndForeignBlobsAreSafe) {
  auto odd = WithLastRank(2, [](auto& o) { o.job_id = "a\nb=c"; });
  EXPECT_EQ(SettingsDisagreement(odd), "job_id is 'default' on rank 0 but 'a\\nb=c' on rank 1");
  // Not UTF-8: still carried and named (escaped), not refused as undecodable.
  auto binary = WithLastRank(2, [](auto& o) { o.job_id = "j\xff"; });
  EXPECT_EQ(SettingsDisagreement(binary), "job_id is 'default' on rank 0 but 'j\\xff' on rank 1");
  std::vector<std::string> foreign = WithLastRank(2, [](SequenceBalancerOptions&) {});
  foreign[1] = EncodeSettings({{"topology", "g1n4"}});
  EXPECT_THAT(SettingsDisagreement(foreign), HasSubstr("rank 1 has 1 settings"));
  foreign[1] = "no equals sign";
  EXPECT_THAT(SettingsDisagreement(foreign), HasSubstr("rank 1 sent settings that do not decode"));
}

TEST(SettingsAgreement, ARankThatRefusedItsArgumentsFailsEveryRankNamingIt) {
  std::vector<std::string> reports = WithLastRank(4, [](SequenceBalancerOptions&) {});
  reports[2] = EncodeSettingsRefusal(absl::InvalidArgumentError("ValueError: bag_specs 'x'"));
  reports[3] = EncodeSettingsRefusal(absl::InvalidArgumentError("ValueError: d_model"));
  const absl::Status status = CheckSettingsAgree(reports);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "rank 2 refused its arguments (ValueError: bag_specs 'x'); every rank fails with it");
}

// The hang of the report: rank 3 with g1n4 while ranks 0-2 have g1n2+g2n1
// (which would make a 2-GPU subgroup rank 3 never joins).
const bool kMismatch = RegisterScenario("mismatch", [](Worker& w) {
  SequenceBalancerOptions options = Base();
  if (w.rank == 3) options.topology = "g1n4";
  const auto start = std::chrono::steady_clock::now();
  auto balancer = SequenceBalancer::Create(options, w.transport.get());
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(balancer.ok());
  EXPECT_EQ(balancer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(balancer.status().message()),
              HasSubstr("topology is 'g1n4' on rank 3 but 'g1n2+g2n1' on ranks 0-2"));
  EXPECT_LT(took, std::chrono::seconds(1));
});

// A topology one rank cannot parse fails every rank too (the others would
// otherwise wait for it in the first collective).
const bool kOneBadTopology = RegisterScenario("one_bad_topology", [](Worker& w) {
  SequenceBalancerOptions options = Base();
  if (w.rank == 1) options.topology = "g1n2+gx";
  auto balancer = SequenceBalancer::Create(options, w.transport.get());
  ASSERT_FALSE(balancer.ok());
  EXPECT_EQ(balancer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(balancer.status().message()), HasSubstr("'g1n2+gx' on rank 1"));
});

TEST(SettingsAgreement, ARankWithAnotherTopologyFailsEveryRankAtOnce) {
  WorkerRun run = RunWorkers("mismatch", 4, {}, std::chrono::seconds(60));
  EXPECT_TRUE(run.ok()) << run.output;
}

TEST(SettingsAgreement, ATopologyOneRankCannotParseFailsEveryRank) {
  WorkerRun run = RunWorkers("one_bad_topology", 4, {}, std::chrono::seconds(60));
  EXPECT_TRUE(run.ok()) << run.output;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) { return knapformer::testing_util::TestMain(argc, argv); }
