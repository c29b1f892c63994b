// The wire scan that admits a request before it is parsed: it follows the
// request messages' descriptors (every field of every request message is
// bounded, and a field added without a bound fails here), its counts are
// the parser's, its refusals name the field and the limit, the memory it
// estimates bounds what parsing takes for the costliest form of every
// field, and the receive limit it derives admits the largest valid request.
#include "server/request_scan.h"

#include <malloc.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/measured_cost.h"
#include "planner/measured_fit.h"
#include "server/arena_messages.h"
#include "server/request_bounds.h"
#include "tests/server/costly_requests.h"
#include "tests/server/parsed_values.h"
#include "tests/server/wire_bytes.h"

namespace knapformer {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using ::testing::HasSubstr;
using testing_util::Field;
using testing_util::ParsedValues;
using testing_util::Tag;
using testing_util::Varint;

absl::StatusOr<RequestShape> ScanAs(const Descriptor* message, const std::string& bytes,
                                    const ServiceLimits& limits = ServiceLimits()) {
  const RequestScanner scanner(limits);
  google::protobuf::io::ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()),
                                               /*block_size=*/7);  // values cross blocks
  return scanner.Scan(message, &input);
}

absl::StatusOr<RequestShape> ScanPlan(const std::string& bytes,
                                      const ServiceLimits& limits = ServiceLimits()) {
  return ScanAs(v1::PlanRequest::descriptor(), bytes, limits);
}

absl::StatusOr<RequestShape> ScanGroup(const std::string& bytes,
                                       const ServiceLimits& limits = ServiceLimits()) {
  return ScanAs(v1::PlanGroupRequest::descriptor(), bytes, limits);
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
  v1::PlanGroupRequest request = GroupRequest();
  for (int i = 0; i < 5; ++i) request.mutable_spec()->mutable_measured_attention()->add_pairs(i);
  absl::StatusOr<RequestShape> shape = ScanGroup(request.SerializeAsString());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_TRUE(shape->over_limit.ok()) << shape->over_limit;
  EXPECT_EQ(shape->message, v1::PlanGroupRequest::descriptor());
  EXPECT_EQ(shape->job_id, "ns/job-1");
  EXPECT_EQ(shape->wire_bytes, static_cast<int64_t>(request.ByteSizeLong()));
  EXPECT_EQ(shape->values, ParsedValues(request));
  const auto* ranks = v1::PlanGroupRequest::descriptor()->FindFieldByName("ranks");
  EXPECT_EQ(shape->values.at(ranks), 3);
  EXPECT_EQ(shape->unknown_fields, 0);

  v1::PlanRequest plan;
  *plan.mutable_spec() = request.spec();
  plan.set_rank(2);
  *plan.mutable_sequence_lengths() = request.ranks(2).sequence_lengths();
  *plan.mutable_attention_masks() = request.ranks(2).attention_masks();
  plan.mutable_previous()->set_compute_seconds(1);
  shape = ScanPlan(plan.SerializeAsString());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->values, ParsedValues(plan));

  v1::GetJobRequest get_job;
  get_job.set_job_id("ns/job-2");
  shape = ScanAs(v1::GetJobRequest::descriptor(), get_job.SerializeAsString());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->job_id, "ns/job-2");
}

TEST(RequestScanTest, CountsUnpackedValuesUnknownFieldsAndTheLastJobId) {
  // Lengths 5 and 300 packed, then 7 unpacked (the parser takes both); an
  // int32 field sent length-delimited and a field this server lacks are
  // unknown, in the request and inside the spec's measured table; the
  // second spec's job id is the one the parser keeps.
  std::string rank = Field(1, Varint(5) + Varint(300)) + Tag(1, 0) + Varint(7);
  std::string table = Tag(1, 1) + std::string(8, '\0') + Tag(7, 0) + Varint(3);
  std::string bytes = Field(1, Field(1, "first") + Field(4, "x") + Field(15, table)) +
                      Field(2, rank) + Tag(99, 0) + Varint(1) + Field(1, Field(1, "second"));
  v1::PlanGroupRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  absl::StatusOr<RequestShape> shape = ScanGroup(bytes);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->job_id, parsed.spec().job_id());
  EXPECT_EQ(shape->job_id, "second");
  EXPECT_EQ(shape->values, ParsedValues(parsed));
  EXPECT_EQ(parsed.ranks(0).sequence_lengths_size(), 3);
  EXPECT_EQ(parsed.spec().measured_attention().pairs_size(), 1);
  EXPECT_EQ(shape->unknown_fields, 3);
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
  // Field number 0, and wire types 6 and 7, are no protobuf at all.
  for (const std::string& bad : {Tag(0, 0) + Varint(1), Tag(5, 6), Tag(5, 7)}) {
    v1::PlanRequest parsed;
    EXPECT_FALSE(parsed.ParseFromString(bad));
    EXPECT_FALSE(ScanPlan(bad).ok());
  }
  // A group (wire type 3) is in no request message; the scan refuses it,
  // known field or not, nested or not.
  EXPECT_FALSE(ScanPlan(Tag(9, 3) + Tag(9, 4)).ok());
  EXPECT_FALSE(ScanPlan(Field(1, Tag(15, 3) + Tag(15, 4))).ok());
  // A job id longer than any valid one is refused unread.
  absl::StatusOr<RequestShape> shape = ScanPlan(Field(1, Field(1, std::string(300, 'j'))));
  ASSERT_FALSE(shape.ok());
  EXPECT_THAT(shape.status().message(),
              HasSubstr("spec.job_id: 300 characters exceed the limit of 256"));
  shape = ScanAs(v1::GetJobRequest::descriptor(), Field(1, std::string(257, 'j')));
  ASSERT_FALSE(shape.ok());
  EXPECT_THAT(shape.status().message(), HasSubstr("job_id: 257 characters exceed the limit"));
}

TEST(RequestScanTest, RefusesEachLimitByName) {
  const std::string bytes = GroupRequest().SerializeAsString();
  absl::StatusOr<RequestShape> shape = ScanGroup(bytes);
  ASSERT_TRUE(shape.ok());
  EXPECT_TRUE(shape->over_limit.ok());
  struct Case {
    void (*narrow)(ServiceLimits*);
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {[](ServiceLimits* l) { l->max_world_size = 2; }, absl::StatusCode::kResourceExhausted,
       "ranks: 3 entries exceed the limit of 2 ranks"},
      {[](ServiceLimits* l) { l->max_sequences_per_rank = 2; },
       absl::StatusCode::kResourceExhausted,
       "ranks[2].sequence_lengths: 3 sequences exceed the limit of 2 per rank"},
      {[](ServiceLimits* l) { l->max_sequences_per_step = 5; },
       absl::StatusCode::kResourceExhausted,
       "ranks[].sequence_lengths: 6 sequences exceed the limit of 5 per step"},
      {[](ServiceLimits* l) { l->max_mask_spans_per_step = 9; },
       absl::StatusCode::kResourceExhausted,
       "ranks[].attention_masks[].span_lengths: 10 spans exceed the limit of 9 per step"},
  };
  for (const Case& c : cases) {
    ServiceLimits limits;
    c.narrow(&limits);
    const absl::Status status = ScanGroup(bytes, limits)->over_limit;
    EXPECT_EQ(status.code(), c.code) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  // Malformed sizes: a timing with more values than grid points (a
  // PlanRequest's previous sent twice merges into one), a measured table
  // over its points, a mask over its spans, a topology over its length.
  v1::PlanRequest plan;
  for (int j = 0; j <= kPairGridPoints; ++j) {
    plan.mutable_previous()->add_attention_by_pair_point(1);
  }
  for (int i = 0; i <= MeasuredAttention::kMaxPoints; ++i) {
    plan.mutable_spec()->mutable_measured_attention()->add_work(1);
  }
  v1::AttentionMask* mask = plan.add_attention_masks();
  for (int i = 0; i <= 4096; ++i) mask->add_span_causal(true);
  shape = ScanPlan(plan.SerializeAsString());
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->over_limit.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shape->over_limit.message(),
              HasSubstr("spec.measured_attention.work: 1025 points exceed the limit of 1024 per "
                        "table"));
  plan.mutable_spec()->clear_measured_attention();
  EXPECT_THAT(ScanPlan(plan.SerializeAsString())->over_limit.message(),
              HasSubstr("previous.attention_by_pair_point: 33 values exceed the limit of 32 (one "
                        "per grid point)"));
  plan.clear_previous();
  EXPECT_THAT(ScanPlan(plan.SerializeAsString())->over_limit.message(),
              HasSubstr("attention_masks[0].span_causal: 4097 spans exceed the limit of 4096 per "
                        "mask"));
  plan.clear_attention_masks();
  plan.mutable_spec()->set_topology(std::string(4097, 'g'));
  EXPECT_THAT(ScanPlan(plan.SerializeAsString())->over_limit.message(),
              HasSubstr("spec.topology: 4097 characters exceed the limit of 4096"));
  // 64 MiB of zero lengths in one rank: refused by count, nothing parsed.
  const std::string zeros = Field(2, Field(1, std::string(64 << 20, '\0')));
  shape = ScanGroup(zeros);
  ASSERT_TRUE(shape.ok());
  EXPECT_THAT(shape->over_limit.message(),
              HasSubstr("ranks[0].sequence_lengths: 67108864 sequences exceed the limit of 65536 "
                        "per rank"));
}

// The scan accounts for every field of every request message: each
// repeated and string field has a bound, and none is of a kind the scan
// cannot price.
TEST(RequestBoundsTest, EveryFieldOfEveryRequestMessageIsBounded) {
  const RequestBounds bounds{ServiceLimits()};
  for (const Descriptor* request : ScannedRequests()) {
    EXPECT_TRUE(bounds.Covers(request).ok()) << bounds.Covers(request);
  }
}

// ...and a message with a field it cannot bound fails Covers, naming it: a
// request message grown a repeated field, a map and a nested copy of itself.
TEST(RequestBoundsTest, AFieldWithoutABoundIsNamed) {
  google::protobuf::FileDescriptorProto file;
  file.set_name("grown.proto");
  file.set_package("grown");
  file.set_syntax("proto3");
  google::protobuf::DescriptorProto* message = file.add_message_type();
  message->set_name("Request");
  auto add = [&](const char* name, int number, google::protobuf::FieldDescriptorProto::Type type,
                 bool repeated) {
    google::protobuf::FieldDescriptorProto* field = message->add_field();
    field->set_name(name);
    field->set_number(number);
    field->set_type(type);
    field->set_label(repeated ? google::protobuf::FieldDescriptorProto::LABEL_REPEATED
                              : google::protobuf::FieldDescriptorProto::LABEL_OPTIONAL);
    return field;
  };
  add("lengths", 1, google::protobuf::FieldDescriptorProto::TYPE_INT64, true);
  add("note", 2, google::protobuf::FieldDescriptorProto::TYPE_STRING, false);
  add("again", 3, google::protobuf::FieldDescriptorProto::TYPE_MESSAGE, false)
      ->set_type_name(".grown.Request");
  google::protobuf::DescriptorPool pool;
  const google::protobuf::FileDescriptor* built = pool.BuildFile(file);
  ASSERT_NE(built, nullptr);
  const absl::Status covered = RequestBounds(ServiceLimits()).Covers(built->message_type(0));
  EXPECT_EQ(covered.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(covered.message(),
              HasSubstr("grown.Request.lengths: a repeated field without a bound"));
  EXPECT_THAT(covered.message(), HasSubstr("grown.Request.note: a string field without a bound"));
  EXPECT_THAT(covered.message(),
              HasSubstr("grown.Request.again: a message that holds itself (unbounded nesting)"));
}

// The heap this process holds (glibc's arenas and its mmapped chunks).
int64_t HeapBytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

// Parses `bytes` as a `message` onto an arena, as the service does; the
// heap it took.
int64_t ParsedBytes(const Descriptor* message, const std::string& bytes) {
  const int64_t before = HeapBytes();
  int64_t taken = 0;
  auto measure = [&](auto* messages) {
    EXPECT_TRUE(messages->request()->ParseFromString(bytes)) << message->name();
    taken = HeapBytes() - before;
    delete messages;
  };
  if (message == v1::PlanRequest::descriptor()) {
    measure(new ArenaMessages<v1::PlanRequest, v1::PlanResponse>());
  } else if (message == v1::PlanGroupRequest::descriptor()) {
    measure(new ArenaMessages<v1::PlanGroupRequest, v1::PlanGroupResponse>());
  } else {
    measure(new ArenaMessages<v1::GetJobRequest, v1::JobState>());
  }
  return taken;
}

TEST(RequestScanTest, EstimateBoundsWhatParsingTakesForEveryFieldsCostliestForm) {
  {
    const int64_t before = HeapBytes();
    std::string probe(1 << 20, 'x');
    if (HeapBytes() - before < (1 << 20)) {
      GTEST_SKIP() << "the heap is not glibc's (a sanitizer's allocator?): nothing to measure";
    }
  }
  std::vector<testing_util::CostlyRequest> cases = testing_util::CostlyRequests(1 << 16);
  testing_util::CostlyRequest ordinary{v1::PlanGroupRequest::descriptor(), "ordinary",
                                       GroupRequest().SerializeAsString()};
  cases.push_back(ordinary);
  ASSERT_GT(cases.size(), 40u);  // every field of every request message, and unknowns
  for (const testing_util::CostlyRequest& c : cases) {
    absl::StatusOr<RequestShape> shape = ScanAs(c.request, c.bytes);
    ASSERT_TRUE(shape.ok()) << c.name << ": " << shape.status();
    const int64_t estimate = EstimatedParsedBytes(*shape);
    const int64_t parsed = ParsedBytes(c.request, c.bytes);
    EXPECT_GE(estimate, parsed + shape->wire_bytes) << c.name;  // the call holds the bytes too
    // Not so loose that the limits it enforces mean nothing.
    EXPECT_LE(estimate - shape->wire_bytes, 8 * parsed + (64 << 10)) << c.name;
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
  spec->set_topology(std::string(4096, 'g'));  // as long as any
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
  absl::StatusOr<RequestShape> shape = ScanGroup(request.SerializeAsString(), limits);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_TRUE(shape->over_limit.ok()) << shape->over_limit;  // at the limits, not past them
  EXPECT_LE(static_cast<int64_t>(request.ByteSizeLong()), MaxRequestWireBytes(limits));
  EXPECT_EQ(ReceiveLimitBytes(limits), MaxRequestWireBytes(limits));
  limits.max_message_bytes = 4096;
  EXPECT_EQ(ReceiveLimitBytes(limits), 4096);
  // The defaults' receive limit: over the sizes the defaults admit, under
  // 80 MiB.
  const int64_t defaults = MaxRequestWireBytes(ServiceLimits());
  std::cout << "receive limit with the default limits: " << defaults << " bytes\n";
  EXPECT_LT(defaults, 80 << 20);
  EXPECT_GT(defaults, 5 * ServiceLimits().max_sequences_per_step);
}

}  // namespace
}  // namespace knapformer
