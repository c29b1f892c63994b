#include "server/request_check.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knapformer/v1/planner.pb.h"
#include "server/service_limits.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kTwoTo31 = int64_t{1} << 31;

v1::StepSpec ValidSpec() {
  v1::StepSpec spec;
  spec.set_job_id("run-42/stage.1:a_b");
  spec.set_group_id("tp0");
  spec.set_step(17);
  spec.set_world_size(8);
  spec.set_topology("g2n1+g1n2");
  spec.set_d_model(1024);
  spec.set_gamma(0.49);
  spec.set_token_bytes(4096);
  return spec;
}

v1::PlanRequest ValidRequest() {
  v1::PlanRequest request;
  *request.mutable_spec() = ValidSpec();
  request.set_rank(5);
  for (int64_t length : {100, 0, 4096}) request.add_sequence_lengths(length);
  return request;
}

v1::PlanGroupRequest ValidGroupRequest() {
  v1::PlanGroupRequest request;
  *request.mutable_spec() = ValidSpec();
  for (int r = 0; r < 8; ++r) {
    v1::RankLengths* rank = request.add_ranks();
    for (int i = 0; i <= r % 3; ++i) rank->add_sequence_lengths(100 * (r + 1) + i);
  }
  return request;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// A malformed PlanRequest: `mutate` breaks ValidRequest().
struct BadRequest {
  const char* name;
  std::function<void(v1::PlanRequest&, ServiceLimits&)> mutate;
  absl::StatusCode code;
  const char* field;    // the message starts with "<field>: "
  const char* message;  // and contains this
};

std::vector<BadRequest> BadRequests() {
  using R = v1::PlanRequest;
  using L = ServiceLimits;
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const auto kExhausted = absl::StatusCode::kResourceExhausted;
  return {
      {"empty job_id", [](R& r, L&) { r.mutable_spec()->clear_job_id(); }, kInvalid, "spec.job_id",
       "must not be empty"},
      {"long job_id", [](R& r, L&) { r.mutable_spec()->set_job_id(std::string(257, 'j')); },
       kInvalid, "spec.job_id", "257 characters exceed the limit of 256"},
      {"job_id with a space", [](R& r, L&) { r.mutable_spec()->set_job_id("my job"); }, kInvalid,
       "spec.job_id", "character 2 is not one of [A-Za-z0-9._:/-]"},
      {"job_id with a non-ASCII byte", [](R& r, L&) { r.mutable_spec()->set_job_id("j\xc3\xb6"); },
       kInvalid, "spec.job_id", "character 1 is not one of"},
      // A scope, not a job: "team-a/" names every job under it.
      {"job_id ending in /", [](R& r, L&) { r.mutable_spec()->set_job_id("team-a/"); }, kInvalid,
       "spec.job_id", "ends in '/'"},
      {"long group_id", [](R& r, L&) { r.mutable_spec()->set_group_id(std::string(257, 'g')); },
       kInvalid, "spec.group_id", "257 characters exceed the limit of 256"},
      {"group_id with a bad character", [](R& r, L&) { r.mutable_spec()->set_group_id("tp#0"); },
       kInvalid, "spec.group_id", "character 2 is not one of [A-Za-z0-9._:/-]"},
      {"world_size 0", [](R& r, L&) { r.mutable_spec()->set_world_size(0); }, kInvalid,
       "spec.world_size", "must be at least 1, got 0"},
      {"negative world_size", [](R& r, L&) { r.mutable_spec()->set_world_size(-8); }, kInvalid,
       "spec.world_size", "must be at least 1, got -8"},
      {"world_size over the limit",
       [](R& r, L& l) {
         l.max_world_size = 8;
         r.mutable_spec()->set_world_size(12);
       },
       kExhausted, "spec.world_size", "12 exceeds the server's limit of 8 ranks"},
      {"world_size not a multiple of the group",
       [](R& r, L&) {
         r.mutable_spec()->set_world_size(6);
         r.set_rank(0);
       },
       kInvalid, "spec.world_size",
       "6 is not a multiple of the group size 4 of topology g1n2+g2n1"},
      {"empty topology", [](R& r, L&) { r.mutable_spec()->clear_topology(); }, kInvalid,
       "spec.topology", "empty spec"},
      {"bad topology", [](R& r, L&) { r.mutable_spec()->set_topology("g0n4"); }, kInvalid,
       "spec.topology", "term 'g0n4': G (GPUs per bag) must be at least 1"},
      {"auto with a bag that is not a power of two",
       [](R& r, L&) { r.mutable_spec()->set_topology("auto:max_bag=3"); }, kInvalid,
       "spec.topology", "'auto:max_bag=3': max_bag=3 is not a power of two"},
      {"auto with an unknown key", [](R& r, L&) { r.mutable_spec()->set_topology("auto:bags=4"); },
       kInvalid, "spec.topology", "unknown key 'bags'"},
      {"auto world not a whole number of groups",
       [](R& r, L&) { r.mutable_spec()->set_topology("auto:group=16"); }, kInvalid,
       "spec.world_size", "8 is not a multiple of the group size 16 of topology auto:max_bag=8"},
      {"auto group not whole nodes",
       [](R& r, L&) {
         r.mutable_spec()->set_topology("auto");
         r.mutable_spec()->mutable_machine()->set_gpus_per_node(3);
       },
       kInvalid, "spec.topology",
       "a group of 8 GPUs is not a whole number of nodes of 3 GPUs (machine.gpus_per_node)"},
      {"auto under a cost model without communication prices",
       [](R& r, L&) {
         r.mutable_spec()->set_topology("auto");
         r.mutable_spec()->set_cost_model(v1::COST_MODEL_LINEAR);
       },
       kInvalid, "spec.topology", "spec.cost_model COST_MODEL_LINEAR has none"},
      {"negative gpus_per_node",
       [](R& r, L&) { r.mutable_spec()->mutable_machine()->set_gpus_per_node(-8); }, kInvalid,
       "spec.machine.gpus_per_node", "-8 is outside [1, 65536]"},
      {"NaN flops_per_second",
       [](R& r, L&) {
         r.mutable_spec()->mutable_machine()->set_flops_per_second(
             std::numeric_limits<double>::quiet_NaN());
       },
       kInvalid, "spec.machine.flops_per_second", "nan is outside"},
      {"d_model 0", [](R& r, L&) { r.mutable_spec()->set_d_model(0); }, kInvalid, "spec.d_model",
       "must be in [1, 65536], got 0"},
      {"d_model 65537", [](R& r, L&) { r.mutable_spec()->set_d_model(65537); }, kInvalid,
       "spec.d_model", "must be in [1, 65536], got 65537"},
      {"negative gamma", [](R& r, L&) { r.mutable_spec()->set_gamma(-0.5); }, kInvalid,
       "spec.gamma", "must be a finite number in [0, 1e6], got -0.5"},
      {"NaN gamma",
       [](R& r, L&) { r.mutable_spec()->set_gamma(std::numeric_limits<double>::quiet_NaN()); },
       kInvalid, "spec.gamma", "must be a finite number"},
      {"infinite gamma",
       [](R& r, L&) { r.mutable_spec()->set_gamma(std::numeric_limits<double>::infinity()); },
       kInvalid, "spec.gamma", "must be a finite number"},
      {"negative token_bytes", [](R& r, L&) { r.mutable_spec()->set_token_bytes(-1); }, kInvalid,
       "spec.token_bytes", "must be >= 0, got -1"},
      {"unknown cost_model",
       [](R& r, L&) { r.mutable_spec()->set_cost_model(static_cast<v1::CostModel>(7)); },
       kInvalid, "spec.cost_model",
       "unknown value 7 (0 transformer, 1 uniform, 2 linear, 3 measured)"},
      {"unknown locality",
       [](R& r, L&) { r.mutable_spec()->set_locality(static_cast<v1::Locality>(3)); },
       kInvalid, "spec.locality", "unknown value 3 (0 planner default, 1 on, 2 off)"},
      {"negative max_tokens_per_gpu",
       [](R& r, L&) { r.mutable_spec()->set_max_tokens_per_gpu(-5); }, kInvalid,
       "spec.max_tokens_per_gpu", "must be >= 0 (0 = no cap), got -5"},
      {"negative compute_seconds",
       [](R& r, L&) { r.mutable_previous()->set_compute_seconds(-1); }, kInvalid,
       "previous.compute_seconds", "must be a finite number in [0, 1e6], got -1"},
      {"NaN compute_seconds",
       [](R& r, L&) {
         r.mutable_previous()->set_compute_seconds(std::numeric_limits<double>::quiet_NaN());
       },
       kInvalid, "previous.compute_seconds", "must be a finite number"},
      {"negative linear_work",
       [](R& r, L&) { r.mutable_previous()->set_linear_work(-2); }, kInvalid,
       "previous.linear_work", "must be a finite number >= 0, got -2"},
      {"infinite attention_work",
       [](R& r, L&) {
         r.mutable_previous()->set_attention_work(std::numeric_limits<double>::infinity());
       },
       kInvalid, "previous.attention_work", "must be a finite number >= 0, got inf"},
      {"attention_by_pair_point of 3 values",
       [](R& r, L&) {
         for (int j = 0; j < 3; ++j) r.mutable_previous()->add_attention_by_pair_point(1);
       },
       kInvalid, "previous.attention_by_pair_point", "3 values; empty, or one per grid point (32)"},
      {"negative attention_by_pair_point",
       [](R& r, L&) {
         for (int j = 0; j < 32; ++j) {
           r.mutable_previous()->add_attention_by_pair_point(j == 4 ? -1 : 0);
         }
       },
       kInvalid, "previous.attention_by_pair_point[4]", "must be a finite number >= 0, got -1"},
      {"rank -1", [](R& r, L&) { r.set_rank(-1); }, kInvalid, "rank",
       "-1 is outside [0, world_size = 8)"},
      {"rank == world_size", [](R& r, L&) { r.set_rank(8); }, kInvalid, "rank",
       "8 is outside [0, world_size = 8)"},
      {"length -1", [](R& r, L&) { r.set_sequence_lengths(2, -1); }, kInvalid,
       "sequence_lengths[2]", "-1 is outside [0, 2147483648]"},
      {"length 2^31+1", [](R& r, L&) { r.set_sequence_lengths(0, kTwoTo31 + 1); }, kInvalid,
       "sequence_lengths[0]", "2147483649 is outside [0, 2147483648]"},
      {"too many sequences", [](R&, L& l) { l.max_sequences_per_rank = 2; }, kExhausted,
       "sequence_lengths", "3 sequences exceed the limit of 2 per rank"},
      // Masks: ValidRequest's lengths are {100, 0, 4096}.
      {"masks for some sequences only", [](R& r, L&) { r.add_attention_masks(); }, kInvalid,
       "attention_masks", "1 masks for 3 sequences (give one per sequence, or none at all)"},
      {"spans that do not add up",
       [](R& r, L&) {
         for (int i = 0; i < 3; ++i) r.add_attention_masks();
         v1::AttentionMask* m = r.mutable_attention_masks(2);
         m->set_kind(v1::AttentionMask::SPANS);
         m->add_span_lengths(4000);
         m->add_span_lengths(95);
       },
       kInvalid, "attention_masks[2].spans", "lengths add up to 4095, the sequence has 4096"},
      {"a window of 0",
       [](R& r, L&) {
         for (int i = 0; i < 3; ++i) r.add_attention_masks();
         r.mutable_attention_masks(0)->set_kind(v1::AttentionMask::WINDOW);
       },
       kInvalid, "attention_masks[0].window", "must be at least 1, got 0"},
      {"a negative window",
       [](R& r, L&) {
         for (int i = 0; i < 3; ++i) r.add_attention_masks();
         r.mutable_attention_masks(0)->set_kind(v1::AttentionMask::WINDOW);
         r.mutable_attention_masks(0)->set_window(-4);
       },
       kInvalid, "attention_masks[0].window", "must be at least 1, got -4"},
      {"an unknown kind",
       [](R& r, L&) {
         for (int i = 0; i < 3; ++i) r.add_attention_masks();
         r.mutable_attention_masks(1)->set_kind(static_cast<v1::AttentionMask::Kind>(9));
       },
       kInvalid, "attention_masks[1].kind", "unknown mask kind 9 (FULL, CAUSAL, WINDOW or SPANS)"},
      {"more spans than the limit",
       [](R& r, L&) {
         for (int i = 0; i < 3; ++i) r.add_attention_masks();
         v1::AttentionMask* m = r.mutable_attention_masks(2);
         m->set_kind(v1::AttentionMask::SPANS);
         for (int j = 0; j < 4097; ++j) m->add_span_lengths(1);
       },
       kInvalid, "attention_masks[2].spans", "4097 spans exceed the limit of 4096"},
      {"span_causal of another size",
       [](R& r, L&) {
         for (int i = 0; i < 3; ++i) r.add_attention_masks();
         v1::AttentionMask* m = r.mutable_attention_masks(0);
         m->set_kind(v1::AttentionMask::SPANS);
         m->add_span_lengths(100);
         m->add_span_causal(true);
         m->add_span_causal(false);
       },
       kInvalid, "attention_masks[0].span_causal", "2 entries for 1 span_lengths"},
      {"an empty span",
       [](R& r, L&) {
         for (int i = 0; i < 3; ++i) r.add_attention_masks();
         v1::AttentionMask* m = r.mutable_attention_masks(0);
         m->set_kind(v1::AttentionMask::SPANS);
         m->add_span_lengths(0);
         m->add_span_lengths(100);
       },
       kInvalid, "attention_masks[0].spans[0]", "length must be in [1, 100]"},
  };
}

TEST(CheckPlanRequestTest, RejectsEachMalformedFieldNamingIt) {
  for (const BadRequest& bad : BadRequests()) {
    SCOPED_TRACE(bad.name);
    v1::PlanRequest request = ValidRequest();
    ServiceLimits limits;
    bad.mutate(request, limits);
    auto checked = CheckPlanRequest(request, limits);
    ASSERT_FALSE(checked.ok()) << "accepted";
    EXPECT_EQ(checked.status().code(), bad.code) << checked.status();
    EXPECT_THAT(Message(checked.status()), StartsWith(std::string(bad.field) + ": "));
    EXPECT_THAT(Message(checked.status()), HasSubstr(bad.message));
  }
}

TEST(CheckPlanRequestTest, AcceptsAValidRequest) {
  auto checked = CheckPlanRequest(ValidRequest(), ServiceLimits());
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->world->world_size(), 8);
  EXPECT_EQ(checked->world->num_replicas(), 2);
  EXPECT_EQ(checked->world->topology().spec(), "g1n2+g2n1");
  EXPECT_EQ(checked->world->topology().group_size(), 4);
  EXPECT_EQ(checked->topology, "g1n2+g2n1");
  EXPECT_FALSE(checked->auto_layout.has_value());
  EXPECT_EQ(checked->cost.d_model(), 1024);
  EXPECT_DOUBLE_EQ(checked->cost.gamma(), 0.49);
}

TEST(CheckPlanRequestTest, AcceptsAutoWithItsCanonicalSpecAndTheMachineDefaults) {
  v1::PlanRequest request = ValidRequest();
  request.mutable_spec()->set_topology("auto:group=4:max_bag=2");
  request.mutable_spec()->mutable_machine()->set_gpus_per_node(4);
  auto checked = CheckPlanRequest(request, ServiceLimits());
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->world, nullptr);
  ASSERT_TRUE(checked->auto_layout.has_value());
  EXPECT_EQ(checked->topology, "auto:max_bag=2:group=4");
  EXPECT_EQ(checked->machine.gpus_per_node, 4);
  EXPECT_EQ(checked->machine.flops_per_second, Machine().flops_per_second);
  EXPECT_EQ(checked->machine.blocks_per_route, Machine().blocks_per_route);
}

TEST(CheckPlanRequestTest, AcceptsTheBoundaryValues) {
  v1::PlanRequest request = ValidRequest();
  request.mutable_spec()->set_job_id(std::string(128, 'j'));
  request.mutable_spec()->set_group_id(std::string(128, 'g'));
  request.mutable_spec()->set_d_model(65536);
  request.mutable_spec()->set_gamma(0.0);
  request.mutable_spec()->set_token_bytes(0);
  request.set_rank(7);
  request.clear_sequence_lengths();
  request.add_sequence_lengths(0);
  request.add_sequence_lengths(kTwoTo31);
  ServiceLimits limits;
  limits.max_world_size = 8;
  limits.max_sequences_per_rank = 2;
  auto checked = CheckPlanRequest(request, limits);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->cost.d_model(), 65536);
  EXPECT_EQ(checked->cost.gamma(), 0.0);

  request.set_rank(0);
  request.clear_sequence_lengths();  // a rank may have no sequences
  EXPECT_TRUE(CheckPlanRequest(request, limits).ok());
}

TEST(CheckPlanRequestTest, AcceptsAnEmptyGroupIdAndNonCanonicalTopology) {
  v1::PlanRequest request = ValidRequest();
  request.mutable_spec()->clear_group_id();
  request.mutable_spec()->set_topology("g1n1+g2n1+g1n1");
  request.mutable_spec()->set_world_size(4);
  request.set_rank(3);
  auto checked = CheckPlanRequest(request, ServiceLimits());
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->world->world_size(), 4);
  EXPECT_EQ(checked->world->num_replicas(), 1);
  EXPECT_EQ(checked->world->topology().spec(), "g1n2+g2n1");
}

TEST(CheckPlanRequestTest, ChecksTheSpecBeforeTheRank) {
  v1::PlanRequest request = ValidRequest();
  request.mutable_spec()->set_d_model(0);
  request.set_rank(-3);
  auto checked = CheckPlanRequest(request, ServiceLimits());
  ASSERT_FALSE(checked.ok());
  EXPECT_THAT(Message(checked.status()), HasSubstr("spec.d_model"));
}

TEST(CheckPlanRequestTest, ReportsTheFirstBadLength) {
  v1::PlanRequest request = ValidRequest();
  request.set_sequence_lengths(1, -7);
  request.set_sequence_lengths(2, -9);
  auto checked = CheckPlanRequest(request, ServiceLimits());
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(checked.status()), HasSubstr("sequence_lengths[1]: -7 is outside"));
}

TEST(CheckJobIdTest, AcceptsTheAllowedAlphabet) {
  EXPECT_TRUE(CheckJobId("a").ok());
  EXPECT_TRUE(CheckJobId("AZaz09._:/-").ok());
  EXPECT_TRUE(CheckJobId(std::string(128, 'x')).ok());
}

TEST(CheckJobIdTest, RejectsEmptyLongAndBadCharacters) {
  absl::Status empty = CheckJobId("");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(empty), HasSubstr("spec.job_id: must not be empty"));

  absl::Status long_id = CheckJobId(std::string(257, 'x'));
  EXPECT_EQ(long_id.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(long_id), HasSubstr("spec.job_id: 257 characters exceed the limit of 256"));

  for (const char* id : {"a b", "a\tb", "a*b", "a\\b", "a@b", "a+b", "a\nb"}) {
    absl::Status bad = CheckJobId(id);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(Message(bad), HasSubstr("spec.job_id: character 1 is not one of")) << id;
  }
  absl::Status nul = CheckJobId(std::string("ab\0c", 4));
  EXPECT_EQ(nul.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(nul), HasSubstr("character 2"));
}

TEST(CheckPlanGroupRequestTest, AcceptsAValidRequest) {
  auto checked = CheckPlanGroupRequest(ValidGroupRequest(), ServiceLimits());
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->spec.world->world_size(), 8);
  EXPECT_EQ(checked->spec.world->topology().spec(), "g1n2+g2n1");
  EXPECT_EQ(checked->spec.cost.d_model(), 1024);
  EXPECT_DOUBLE_EQ(checked->spec.cost.gamma(), 0.49);
  // The step as the solve takes it, checked here once.
  const v1::PlanGroupRequest request = ValidGroupRequest();
  ASSERT_EQ(checked->input.world_size(), request.ranks_size());
  for (int r = 0; r < request.ranks_size(); ++r) {
    EXPECT_THAT(checked->input.lengths()[r],
                testing::ElementsAreArray(request.ranks(r).sequence_lengths()));
  }
  EXPECT_EQ(checked->input.masks(), nullptr);
}

TEST(CheckPlanGroupRequestTest, ChecksTheSpec) {
  v1::PlanGroupRequest request = ValidGroupRequest();
  request.mutable_spec()->set_topology("g1n2+");
  auto checked = CheckPlanGroupRequest(request, ServiceLimits());
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(checked.status()), HasSubstr("spec.topology: "));

  request = ValidGroupRequest();
  request.mutable_spec()->set_job_id("");
  checked = CheckPlanGroupRequest(request, ServiceLimits());
  ASSERT_FALSE(checked.ok());
  EXPECT_THAT(Message(checked.status()), HasSubstr("spec.job_id: must not be empty"));

  request = ValidGroupRequest();
  ServiceLimits limits;
  limits.max_world_size = 4;
  checked = CheckPlanGroupRequest(request, limits);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(checked.status()), HasSubstr("spec.world_size: 8 exceeds"));
}

TEST(CheckPlanGroupRequestTest, RejectsTheWrongNumberOfRanks) {
  for (int ranks : {0, 7, 9}) {
    SCOPED_TRACE(ranks);
    v1::PlanGroupRequest request = ValidGroupRequest();
    while (request.ranks_size() > ranks) request.mutable_ranks()->RemoveLast();
    while (request.ranks_size() < ranks) request.add_ranks();
    auto checked = CheckPlanGroupRequest(request, ServiceLimits());
    ASSERT_FALSE(checked.ok());
    EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(checked.status()),
                HasSubstr("ranks: " + std::to_string(ranks) + " entries, but world_size is 8"));
  }
}

TEST(CheckPlanGroupRequestTest, TakesNoTimingsOrOnePerRankAndChecksEach) {
  v1::PlanGroupRequest request = ValidGroupRequest();
  for (int r = 0; r < 8; ++r) request.add_previous()->set_compute_seconds(r * 0.5);
  EXPECT_TRUE(CheckPlanGroupRequest(request, ServiceLimits()).ok());

  request.mutable_previous()->RemoveLast();
  auto checked = CheckPlanGroupRequest(request, ServiceLimits());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(checked.status()),
              HasSubstr("previous: 7 entries; give none or world_size = 8"));

  request.add_previous()->set_compute_seconds(std::numeric_limits<double>::infinity());
  checked = CheckPlanGroupRequest(request, ServiceLimits());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(checked.status()),
              HasSubstr("previous[7].compute_seconds: must be a finite number in [0, 1e6]"));
}

TEST(CheckPlanGroupRequestTest, RejectsABadLengthNamingItsRank) {
  v1::PlanGroupRequest request = ValidGroupRequest();
  request.mutable_ranks(2)->add_sequence_lengths(-5);  // index 3 of rank 2
  auto checked = CheckPlanGroupRequest(request, ServiceLimits());
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(checked.status()),
              HasSubstr("ranks[2].sequence_lengths[3]: -5 is outside [0, 2147483648]"));

  request = ValidGroupRequest();
  request.mutable_ranks(6)->set_sequence_lengths(0, kTwoTo31 + 1);
  checked = CheckPlanGroupRequest(request, ServiceLimits());
  ASSERT_FALSE(checked.ok());
  EXPECT_THAT(Message(checked.status()),
              HasSubstr("ranks[6].sequence_lengths[0]: 2147483649 is outside"));
}

TEST(CheckPlanGroupRequestTest, TakesMasksOnEveryRankOrNoneAndChecksEach) {
  v1::PlanGroupRequest request = ValidGroupRequest();
  for (int r = 0; r < 8; ++r) {
    for (int i = 0; i < request.ranks(r).sequence_lengths_size(); ++i) {
      request.mutable_ranks(r)->add_attention_masks()->set_kind(v1::AttentionMask::CAUSAL);
    }
  }
  EXPECT_TRUE(CheckPlanGroupRequest(request, ServiceLimits()).ok());
  v1::PlanGroupRequest some = request;
  some.mutable_ranks(3)->clear_attention_masks();
  auto checked = CheckPlanGroupRequest(some, ServiceLimits());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(checked.status()),
              StartsWith("ranks[3].attention_masks: none for 1 sequences, while "
                         "ranks[0].attention_masks gives masks"));
  v1::PlanGroupRequest bad = request;
  v1::AttentionMask* mask = bad.mutable_ranks(5)->mutable_attention_masks(2);
  mask->set_kind(v1::AttentionMask::SPANS);
  mask->add_span_lengths(7);
  checked = CheckPlanGroupRequest(bad, ServiceLimits());
  EXPECT_THAT(Message(checked.status()),
              StartsWith("ranks[5].attention_masks[2].spans: lengths add up to 7, the sequence "
                         "has 602 tokens"));
}

TEST(CheckPlanGroupRequestTest, RejectsTooManySequencesInOneRank) {
  v1::PlanGroupRequest request = ValidGroupRequest();
  ServiceLimits limits;
  limits.max_sequences_per_rank = 2;  // rank 2 has 3
  auto checked = CheckPlanGroupRequest(request, limits);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(checked.status()),
              HasSubstr("ranks[2].sequence_lengths: 3 sequences exceed the limit of 2 per rank"));
}

TEST(CheckPlanGroupRequestTest, RejectsTooManySequencesInTotal) {
  // Ranks hold 1,2,3,1,2,3,1,2 sequences: 15 in all.
  v1::PlanGroupRequest request = ValidGroupRequest();
  ServiceLimits limits;
  limits.max_sequences_per_step = 14;
  auto checked = CheckPlanGroupRequest(request, limits);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(checked.status()),
              HasSubstr("ranks: 15 sequences exceed the limit of 14 per step"));

  limits.max_sequences_per_step = 15;
  EXPECT_TRUE(CheckPlanGroupRequest(request, limits).ok());
}

}  // namespace
}  // namespace knapformer

namespace knapformer {
namespace {

TEST(WorldCacheTest, SharesOneWorldPerTopologyAndSizeAndDoesNotCacheErrors) {
  WorldCache cache(/*capacity=*/2);
  auto a = cache.Get("g1n2+g2n1", 8);
  auto b = cache.Get("g1n2+g2n1", 8);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ((*a)->num_replicas(), 2);
  auto other_size = cache.Get("g1n2+g2n1", 4);
  ASSERT_TRUE(other_size.ok());
  EXPECT_NE(other_size->get(), a->get());
  EXPECT_EQ((*other_size)->num_replicas(), 1);

  auto bad = cache.Get("g1n2+", 8);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("spec.topology: "));
  auto not_multiple = cache.Get("g4n1", 6);
  ASSERT_FALSE(not_multiple.ok());
  EXPECT_THAT(std::string(not_multiple.status().message()),
              HasSubstr("spec.world_size: 6 is not a multiple"));

  // A third spec fills the cache past its capacity: it starts over, and
  // the old worlds are rebuilt (new objects), still equal.
  ASSERT_TRUE(cache.Get("g8n1", 8).ok());
  auto again = cache.Get("g1n2+g2n1", 8);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->get(), a->get());
  EXPECT_EQ((*again)->topology().spec(), (*a)->topology().spec());
}

}  // namespace
}  // namespace knapformer
