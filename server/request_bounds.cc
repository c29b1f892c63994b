#include "server/request_bounds.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/attention_mask.h"
#include "planner/measured_cost.h"
#include "planner/measured_fit.h"
#include "planner/topology.h"

namespace knapformer {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Bytes of a field's tag: its number and wire type as a varint.
int64_t TagBytes(int number) {
  uint64_t tag = static_cast<uint64_t>(number) << 3;
  int64_t bytes = 1;
  while (tag >= 0x80) {
    tag >>= 7;
    ++bytes;
  }
  return bytes;
}

// A length prefix of a message or run under 2 GiB.
constexpr int64_t kLengthBytes = 5;

bool IsString(const FieldDescriptor* field) {
  return field->type() == FieldDescriptor::TYPE_STRING ||
         field->type() == FieldDescriptor::TYPE_BYTES;
}

}  // namespace

ValueForm ValueFormOf(const FieldDescriptor* field) {
  switch (field->type()) {
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
      return {kWireFixed64, 8, 8};
    case FieldDescriptor::TYPE_FLOAT:
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
      return {kWireFixed32, 4, 4};
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_MESSAGE:
      return {kWireLengthDelimited, 0, 0};
    case FieldDescriptor::TYPE_GROUP:
      return {-1, 0, 0};
    case FieldDescriptor::TYPE_BOOL:
      return {kWireVarint, 1, 1};
    case FieldDescriptor::TYPE_UINT32:
    case FieldDescriptor::TYPE_SINT32:
      return {kWireVarint, 5, 4};
    case FieldDescriptor::TYPE_INT64:
    case FieldDescriptor::TYPE_UINT64:
    case FieldDescriptor::TYPE_SINT64:
      return {kWireVarint, 10, 8};
    default:  // int32 and enum: negative values are sign-extended to ten bytes
      return {kWireVarint, 10, 4};
  }
}

RequestBounds::RequestBounds(const ServiceLimits& limits) {
  auto at = [this](const Descriptor* message, int number) -> FieldBound& {
    return bounds_[message->FindFieldByNumber(number)];
  };
  const FieldBound id{kMaxIdLength, -1, "characters", "", "", /*malformed_when_over=*/true};
  FieldBound job_id = id;
  job_id.names_job = true;
  at(v1::StepSpec::descriptor(), v1::StepSpec::kJobIdFieldNumber) = job_id;
  at(v1::GetJobRequest::descriptor(), v1::GetJobRequest::kJobIdFieldNumber) = job_id;
  at(v1::StepSpec::descriptor(), v1::StepSpec::kGroupIdFieldNumber) = id;
  at(v1::StepSpec::descriptor(), v1::StepSpec::kTopologyFieldNumber) =
      FieldBound{Topology::kMaxSpecLength, -1, "characters", "", "", true};

  const FieldBound ranks{limits.max_world_size, -1, "entries", " ranks"};
  at(v1::PlanGroupRequest::descriptor(), v1::PlanGroupRequest::kRanksFieldNumber) = ranks;
  at(v1::PlanGroupRequest::descriptor(), v1::PlanGroupRequest::kPreviousFieldNumber) = ranks;
  at(v1::PlanGroupRequest::descriptor(), v1::PlanGroupRequest::kRankSpeedsFieldNumber) = ranks;

  const FieldBound sequences{limits.max_sequences_per_rank, limits.max_sequences_per_step,
                             "sequences", " per rank", " per step"};
  const FieldBound masks{limits.max_sequences_per_rank, limits.max_sequences_per_step, "masks",
                         " per rank (one per sequence)", " per step (one per sequence)"};
  at(v1::PlanRequest::descriptor(), v1::PlanRequest::kSequenceLengthsFieldNumber) = sequences;
  at(v1::RankLengths::descriptor(), v1::RankLengths::kSequenceLengthsFieldNumber) = sequences;
  at(v1::PlanRequest::descriptor(), v1::PlanRequest::kAttentionMasksFieldNumber) = masks;
  at(v1::RankLengths::descriptor(), v1::RankLengths::kAttentionMasksFieldNumber) = masks;

  const FieldBound spans{AttentionMask::kMaxSpans, limits.max_mask_spans_per_step, "spans",
                         " per mask", " per step", true};
  at(v1::AttentionMask::descriptor(), v1::AttentionMask::kSpanLengthsFieldNumber) = spans;
  at(v1::AttentionMask::descriptor(), v1::AttentionMask::kSpanCausalFieldNumber) = spans;

  at(v1::StepTiming::descriptor(), v1::StepTiming::kAttentionByPairPointFieldNumber) =
      FieldBound{kPairGridPoints, -1, "values", " (one per grid point)", "", true};
  const FieldBound points{MeasuredAttention::kMaxPoints, -1, "points", " per table", "", true};
  at(v1::MeasuredAttention::descriptor(), v1::MeasuredAttention::kPairsFieldNumber) = points;
  at(v1::MeasuredAttention::descriptor(), v1::MeasuredAttention::kWorkFieldNumber) = points;
}

const FieldBound* RequestBounds::Of(const FieldDescriptor* field) const {
  auto it = bounds_.find(field);
  return it == bounds_.end() ? nullptr : &it->second;
}

absl::Status RequestBounds::Covers(const Descriptor* root) const {
  std::vector<std::string> missing;
  std::vector<const Descriptor*> path;  // the types being visited, outermost first
  auto visit = [&](auto&& self, const Descriptor* message) -> void {
    path.push_back(message);
    if (static_cast<int>(path.size()) > kMaxDepth) {
      missing.push_back(absl::StrCat(message->full_name(), ": nested deeper than ", kMaxDepth,
                                     " messages"));
      path.pop_back();
      return;
    }
    for (int i = 0; i < message->field_count(); ++i) {
      const FieldDescriptor* field = message->field(i);
      const std::string name = field->full_name();
      if (field->number() > kMaxFieldNumber) {
        missing.push_back(absl::StrCat(name, ": field number ", field->number(), " over ",
                                       kMaxFieldNumber, " (the scan's tables)"));
      }
      if (field->type() == FieldDescriptor::TYPE_GROUP) {
        missing.push_back(absl::StrCat(name, ": a group (the scan refuses groups)"));
      } else if (field->is_map()) {
        missing.push_back(absl::StrCat(name, ": a map (parsed into a hash map, not priced)"));
      } else if (field->is_repeated() && IsString(field)) {
        missing.push_back(absl::StrCat(name, ": repeated strings (no bound per string)"));
      } else if ((field->is_repeated() || IsString(field)) && Of(field) == nullptr) {
        missing.push_back(absl::StrCat(
            name, ": ", field->is_repeated() ? "a repeated" : "a string",
            " field without a bound in server/request_bounds.cc"));
      }
      if (field->type() != FieldDescriptor::TYPE_MESSAGE) continue;
      const Descriptor* child = field->message_type();
      if (std::find(path.begin(), path.end(), child) != path.end()) {
        missing.push_back(absl::StrCat(name, ": a message that holds itself (unbounded nesting)"));
      } else {
        self(self, child);
      }
    }
    path.pop_back();
  };
  visit(visit, root);
  if (missing.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("the request scan does not account for ",
                                          root->full_name(), ": ",
                                          absl::StrJoin(missing, "; ")));
}

int64_t RequestBounds::MaxWireBytes(const Descriptor* root) const {
  // The bytes of `instances` messages of type `message`, at most.
  auto size = [&](auto&& self, const Descriptor* message, int64_t instances) -> int64_t {
    int64_t bytes = 0;
    for (int i = 0; i < message->field_count(); ++i) {
      const FieldDescriptor* field = message->field(i);
      const int64_t tag = TagBytes(field->number());
      const FieldBound* bound = Of(field);
      // Values of the field over all `instances` messages.
      int64_t values = instances;
      if (field->is_repeated()) {
        values = bound->per_message * instances;
        if (bound->per_request >= 0) values = std::min(values, bound->per_request);
      }
      if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
        bytes += values * (tag + kLengthBytes) + self(self, field->message_type(), values);
      } else if (IsString(field)) {
        bytes += instances * (tag + kLengthBytes + bound->per_message);
      } else if (field->is_repeated()) {  // packed: one run per message
        bytes += instances * (tag + kLengthBytes) + values * ValueFormOf(field).widest_bytes;
      } else {
        bytes += instances * (tag + ValueFormOf(field).widest_bytes);
      }
    }
    return bytes;
  };
  return size(size, root, 1);
}

const std::vector<const Descriptor*>& ScannedRequests() {
  static const std::vector<const Descriptor*> kRequests = {
      v1::PlanRequest::descriptor(), v1::PlanGroupRequest::descriptor(),
      v1::GetJobRequest::descriptor()};
  return kRequests;
}

}  // namespace knapformer
