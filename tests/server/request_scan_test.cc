// The wire scan that admits a request before it is parsed: its counts are
// the parser's, its refusals name the field and the limit, the memory it
// estimates bounds what parsing takes, and the receive limit it derives
// admits the largest valid request.
#include "server/request_scan.h"

#include <malloc.h>

#include <cstdint>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/measured_cost.h"
#include "planner/measured_fit.h"
#include "server/arena_messages.h"
#include "tests/server/wire_bytes.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;
using testing_util::Field;
using testing_util::Tag;
using testing_util::Varint;

absl::StatusOr<RequestShape> ScanPlan(const std::string& bytes) {
  google::protobuf::io::ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()),
                                               /*block_size=*/7);  // values cross blocks
  return ScanPlanRequest(&input);
}

absl::StatusOr<RequestShape> ScanGroup(const std::string& bytes) {
  google::protobuf::io::ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()),
                                               /*block_size=*/7);
  return ScanPlanGroupRequest(&input);
}

v1::AttentionMask SpansMask(int spans) {
  v1::AttentionMask mask;
  mask.set_kind(v1::AttentionMask::SPANS);
  for (int i = 0; i < spans; ++i) {
    mask.add_span_lengths(100 + i);
    mask.add_span_causal(i % 2 == 0);
  }
  return mask;
}

v1::PlanGroupRequest GroupRequest() {
  v1::PlanGroupRequest request;
  request.mutable_spec()->set_job_id("ns/job-1");
  request.mutable_spec()->set_world_size(3);
  request.mutable_spec()->set_topology("g1n3");
  request.mutable_spec()->mutable_machine()->set_gpus_per_node(8);
  for (int r = 0; r < 3; ++r) {
    v1::RankLengths* rank = request.add_ranks();
    for (int i = 0; i <= r; ++i) {
      rank->add_sequence_lengths(int64_t{1} << (10 * i));
      *rank->add_attention_masks() = SpansMask(i + 1);
    }
    v1::StepTiming* timing = request.add_previous();
    timing->set_step(7);
    timing->set_compute_seconds(0.5);
    for (int j = 0; j < kPairGridPoints; ++j) timing->add_attention_by_pair_point(j == 5);
  }
  return request;
}

TEST(RequestScanTest, CountsWhatTheParserFinds) {
  const v1::PlanGroupRequest request = GroupRequest();
  absl::StatusOr<RequestShape> shape = ScanGroup(request.SerializeAsString());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_TRUE(shape->group);
  EXPECT_EQ(shape->job_id, "ns/job-1");
  EXPECT_EQ(shape->wire_bytes, static_cast<int64_t>(request.ByteSizeLong()));
  EXPECT_EQ(shape->ranks, 3);
  EXPECT_EQ(shape->timings, 3);
  EXPECT_EQ(shape->timing_weights, 3 * kPairGridPoints);
  EXPECT_EQ(shape->sequences, 6);
  EXPECT_EQ(shape->masks, 6);
  EXPECT_EQ(shape->span_lengths, 1 + (1 + 2) + (1 + 2 + 3));
  EXPECT_EQ(shape->span_flags, shape->span_lengths);
  EXPECT_EQ(shape->rank_sequences, 3);
  EXPECT_EQ(shape->fullest_rank, 2);
  EXPECT_EQ(shape->unknown_fields, 0);

  v1::PlanRequest plan;
  *plan.mutable_spec() = request.spec();
  plan.set_rank(2);
  *plan.mutable_sequence_lengths() = request.ranks(2).sequence_lengths();
  *plan.mutable_attention_masks() = request.ranks(2).attention_masks();
  plan.mutable_previous()->set_compute_seconds(1);
  shape = ScanPlan(plan.SerializeAsString());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_FALSE(shape->group);
  EXPECT_EQ(shape->ranks, 1);
  EXPECT_EQ(shape->sequences, 3);
  EXPECT_EQ(shape->masks, 3);
  EXPECT_EQ(shape->span_lengths, 6);
}

TEST(RequestScanTest, CountsUnpackedValuesUnknownFieldsAndTheLastJobId) {
  // Lengths 5 and 300 packed, then 7 unpacked (the parser takes both); an
  // int32 field sent length-delimited and a field this server lacks are
  // unknown; the second spec's job id is the one the parser keeps.
  std::string rank = Field(1, Varint(5) + Varint(300)) + Tag(1, 0) + Varint(7);
  std::string bytes = Field(1, Field(1, "first") + Field(4, "x")) + Field(2, rank) +
                      Tag(99, 0) + Varint(1) + Field(1, Field(1, "second"));
  v1::PlanGroupRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  absl::StatusOr<RequestShape> shape = ScanGroup(bytes);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->job_id, parsed.spec().job_id());
  EXPECT_EQ(shape->job_id, "second");
  EXPECT_EQ(shape->sequences, parsed.ranks(0).sequence_lengths_size());
  EXPECT_EQ(shape->sequences, 3);
  EXPECT_EQ(shape->unknown_fields, 2);
}

TEST(RequestScanTest, RefusesWhatTheParserRefuses) {
  const std::string bytes = GroupRequest().SerializeAsString();
  for (size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t{3}}) {
    const std::string truncated = bytes.substr(0, cut);
    v1::PlanGroupRequest parsed;
    ASSERT_FALSE(parsed.ParseFromString(truncated)) << cut;
    absl::StatusOr<RequestShape> shape = ScanGroup(truncated);
    ASSERT_FALSE(shape.ok()) << cut;
    EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(shape.status().message(), HasSubstr("not a valid PlanGroupRequest (malformed at"));
  }
  // A group (wire type 3) is in no knapformer message.
  EXPECT_FALSE(ScanPlan(Tag(9, 3) + Tag(9, 4)).ok());
  // A job id longer than any valid one is refused unread.
  absl::StatusOr<RequestShape> shape = ScanPlan(Field(1, Field(1, std::string(300, 'j'))));
  ASSERT_FALSE(shape.ok());
  EXPECT_THAT(shape.status().message(),
              HasSubstr("spec.job_id: 300 characters exceed the limit of 256"));
}

TEST(RequestScanTest, RefusesEachLimitByName) {
  const std::string bytes = GroupRequest().SerializeAsString();
  absl::StatusOr<RequestShape> shape = ScanGroup(bytes);
  ASSERT_TRUE(shape.ok());
  EXPECT_TRUE(CheckRequestShape(*shape, ServiceLimits()).ok());
  struct Case {
    void (*narrow)(ServiceLimits*);
    const char* message;
  };
  const Case cases[] = {
      {[](ServiceLimits* l) { l->max_world_size = 2; },
       "ranks: 3 entries exceed the limit of 2 ranks"},
      {[](ServiceLimits* l) { l->max_sequences_per_rank = 2; },
       "ranks[2].sequence_lengths: 3 sequences exceed the limit of 2 per rank"},
      {[](ServiceLimits* l) { l->max_sequences_per_step = 5; },
       "ranks: 6 sequences exceed the limit of 5 per step"},
      {[](ServiceLimits* l) { l->max_mask_spans_per_step = 9; },
       "ranks[].attention_masks: 10 spans exceed the limit of 9 per step"},
  };
  for (const Case& c : cases) {
    ServiceLimits limits;
    c.narrow(&limits);
    const absl::Status status = CheckRequestShape(*shape, limits);
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  // A timing with more values than grid points (a PlanRequest's previous
  // sent twice merges into one).
  v1::PlanRequest plan;
  for (int j = 0; j <= kPairGridPoints; ++j) {
    plan.mutable_previous()->add_attention_by_pair_point(1);
  }
  shape = ScanPlan(plan.SerializeAsString());
  ASSERT_TRUE(shape.ok());
  EXPECT_THAT(CheckRequestShape(*shape, ServiceLimits()).message(),
              HasSubstr("previous.attention_by_pair_point: 33 values exceed the limit of 32 (one "
                        "per grid point per timing)"));
  // 64 MiB of zero lengths in one rank: refused by count, nothing parsed.
  const std::string zeros = Field(2, Field(1, std::string(64 << 20, '\0')));
  shape = ScanGroup(zeros);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->sequences, int64_t{64} << 20);
  EXPECT_THAT(CheckRequestShape(*shape, ServiceLimits()).message(),
              HasSubstr("ranks[0].sequence_lengths: 67108864 sequences exceed the limit of 65536 "
                        "per rank"));
}

// The heap this process holds (glibc's arenas and its mmapped chunks).
int64_t HeapBytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

// Parses `bytes` onto an arena as the service does; the heap it took.
template <typename Request, typename Response>
int64_t ParsedBytes(const std::string& bytes) {
  const int64_t before = HeapBytes();
  auto* messages = new ArenaMessages<Request, Response>();
  EXPECT_TRUE(messages->request()->ParseFromString(bytes));
  const int64_t taken = HeapBytes() - before;
  delete messages;
  return taken;
}

TEST(RequestScanTest, EstimateBoundsWhatParsingTakes) {
  {
    const int64_t before = HeapBytes();
    std::string probe(1 << 20, 'x');
    if (HeapBytes() - before < (1 << 20)) {
      GTEST_SKIP() << "the heap is not glibc's (a sanitizer's allocator?): nothing to measure";
    }
  }
  // The shapes that cost most per byte sent, each at a per-rank or per-step
  // limit's size, and the ordinary request.
  const int kCount = 1 << 16;
  std::string empty_masks, spans, empty_ranks, unknown, timings;
  for (int i = 0; i < kCount; ++i) {
    empty_masks += Field(2, "");
    empty_ranks += Field(2, "");
    unknown += Tag(99, 0) + Varint(0);
    timings += Field(4, "");
  }
  std::string span_run(kCount, '\1');
  spans = Field(2, Field(2, Field(3, span_run) + Field(4, span_run)));
  const struct {
    const char* name;
    std::string bytes;
  } cases[] = {
      {"zero lengths", Field(2, Field(1, std::string(kCount, '\0')))},
      {"empty masks", Field(2, Field(1, std::string(kCount, '\0')) + empty_masks)},
      {"spans", spans},
      {"empty ranks", empty_ranks},
      {"unknown fields", unknown},
      {"timings", timings},
      {"ordinary", GroupRequest().SerializeAsString()},
  };
  for (const auto& c : cases) {
    absl::StatusOr<RequestShape> shape = ScanGroup(c.bytes);
    ASSERT_TRUE(shape.ok()) << c.name << ": " << shape.status();
    const int64_t estimate = EstimatedParsedBytes(*shape);
    const int64_t parsed = ParsedBytes<v1::PlanGroupRequest, v1::PlanGroupResponse>(c.bytes);
    EXPECT_GE(estimate, parsed) << c.name;
    // Not so loose that the limits it enforces mean nothing.
    EXPECT_LE(estimate, 8 * parsed + (64 << 10)) << c.name;
    std::cout << c.name << ": " << c.bytes.size() << " bytes sent, " << parsed
              << " parsed, estimated " << estimate << "\n";
  }
}

TEST(RequestScanTest, ReceiveLimitAdmitsTheLargestValidRequest) {
  ServiceLimits limits;
  limits.max_world_size = 4;
  limits.max_sequences_per_step = 8;
  limits.max_sequences_per_rank = 8;
  limits.max_mask_spans_per_step = 16;
  v1::PlanGroupRequest request;
  v1::StepSpec* spec = request.mutable_spec();
  spec->set_job_id(std::string(256, 'j'));
  spec->set_group_id(std::string(256, 'g'));
  spec->set_topology("g1n1+g1n1+g1n1+g1n1");
  spec->set_world_size(4);
  spec->set_step(~uint64_t{0});
  spec->set_d_model(INT32_MAX);
  spec->set_gamma(1);
  spec->set_token_bytes(INT64_MAX);
  spec->set_max_tokens_per_gpu(INT64_MAX);
  spec->set_incarnation(~uint64_t{0});
  spec->mutable_machine()->set_flops_per_second(1);
  spec->mutable_machine()->set_gpus_per_node(INT32_MAX);
  spec->set_cost_model(v1::COST_MODEL_MEASURED);
  for (int i = 0; i < MeasuredAttention::kMaxPoints; ++i) {
    spec->mutable_measured_attention()->add_pairs(1e300);
    spec->mutable_measured_attention()->add_work(1e300);
  }
  request.set_include_rank_plans(true);
  for (int r = 0; r < 4; ++r) {
    v1::RankLengths* rank = request.add_ranks();
    for (int i = 0; i < 2; ++i) {
      rank->add_sequence_lengths(int64_t{1} << 31);
      v1::AttentionMask* mask = rank->add_attention_masks();
      mask->set_kind(v1::AttentionMask::WINDOW);
      mask->set_window(INT64_MAX);
      for (int s = 0; s < 2; ++s) {
        mask->add_span_lengths(int64_t{1} << 31);
        mask->add_span_causal(true);
      }
    }
    v1::StepTiming* timing = request.add_previous();
    timing->set_step(~uint64_t{0});
    timing->set_compute_seconds(1);
    timing->set_linear_work(1);
    timing->set_attention_work(1);
    for (int j = 0; j < kPairGridPoints; ++j) timing->add_attention_by_pair_point(1);
  }
  EXPECT_LE(static_cast<int64_t>(request.ByteSizeLong()), MaxRequestWireBytes(limits));
  EXPECT_EQ(ReceiveLimitBytes(limits), MaxRequestWireBytes(limits));
  limits.max_message_bytes = 4096;
  EXPECT_EQ(ReceiveLimitBytes(limits), 4096);
  // The defaults' receive limit: under gRPC's old 64 MiB, over the sizes
  // the defaults admit.
  const int64_t defaults = MaxRequestWireBytes(ServiceLimits());
  EXPECT_LT(defaults, 64 << 20);
  EXPECT_GT(defaults, 5 * ServiceLimits().max_sequences_per_step);
}

}  // namespace
}  // namespace knapformer
