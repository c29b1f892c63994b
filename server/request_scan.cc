#include "server/request_scan.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"

namespace knapformer {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;

// Groups (wire types 3, 4) are in no request message (RequestBounds::Covers),
// and the scan refuses them, known or not.

// What parsing allocates, measured against glibc's heap by
// request_scan_test (EstimateBoundsWhatParsingTakesForEveryFieldsCostliestForm).
// A repeated field grows by doubling and an arena keeps the arrays it
// outgrew: at most 4 times its final size in all.
constexpr int64_t kGrowth = 4;
// A string the parser makes (a field's, on the arena, or an unknown
// field's, on the heap): the object, its arena cleanup entry or malloc
// header, and its buffer's malloc header and rounding (the characters
// themselves are counted with the wire bytes).
constexpr int64_t kStringBytes = sizeof(std::string) + 32;
// An unknown field: an entry of its message's growing UnknownFieldSet
// (heap), and the set itself the first time.
constexpr int64_t kUnknownFieldBytes = sizeof(google::protobuf::UnknownField) * kGrowth;
constexpr int64_t kUnknownFieldSetBytes = sizeof(google::protobuf::UnknownFieldSet) + 64;
// A message object made on the arena: its alignment, and its share of the
// arena's block headers and of the room blocks leave unused.
constexpr int64_t kArenaObjectBytes = 32;
// A call's fixed part: the arena's first blocks and gRPC's own state.
constexpr int64_t kCallBytes = 16 << 10;

// The bytes of one parsed message object of type `message`.
int64_t ObjectBytes(const Descriptor* message) {
  const google::protobuf::Message* prototype =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(message);
  return prototype == nullptr ? 1024 : static_cast<int64_t>(prototype->SpaceUsedLong());
}

}  // namespace

// How the scan reads one message type: for each field number, its field's
// wire form, what one value costs parsed, and its bound.
struct RequestScanner::MessagePlan {
  struct Field {
    const FieldDescriptor* descriptor = nullptr;
    int wire = kWireVarint;  // of one value
    // Repeated scalars: also sent as one length-delimited run (packed);
    // fixed_width is a value's bytes there (0: varints).
    bool packable = false;
    int64_t fixed_width = 0;
    // Memory one value costs parsed: a scalar in its growing array, a
    // message object (and its pointer), a string object.
    int64_t parsed_bytes = 0;
    const MessagePlan* message = nullptr;
    const FieldBound* bound = nullptr;
  };
  const Descriptor* descriptor = nullptr;
  std::vector<Field> fields;   // by the field's index in the message
  std::vector<int> by_number;  // field number -> index in `fields`; -1: unknown

  const Field* Find(uint32_t number) const {
    if (number >= by_number.size() || by_number[number] < 0) return nullptr;
    return &fields[by_number[number]];
  }
};

// One request's walk: reads each message's fields as the parser would,
// counting what parsing would allocate and holding each field to its bound.
class RequestScanner::Walk {
 public:
  Walk(google::protobuf::io::ZeroCopyInputStream* input, RequestShape* shape)
      : in_(input), shape_(*shape) {}

  // Reads one `plan` message's fields up to the current limit (or the end
  // of the input). False on bytes the parser refuses (or a group), and for
  // a job id over its bound (refusal() says so).
  bool Message(const MessagePlan& plan);
  // The request's totals against the bounds per request.
  void CheckTotals();

  int64_t position() const { return in_.CurrentPosition(); }
  const absl::Status& refusal() const { return refusal_; }

 private:
  // A step from the request down to a nested message: the field holding
  // it, and its index there (repeated fields).
  struct Step {
    const FieldDescriptor* field = nullptr;
    int64_t index = 0;
  };
  struct Total {
    const FieldBound* bound = nullptr;
    int64_t values = 0;
    // Where the field was first met (for naming it), indices aside.
    Step path[RequestBounds::kMaxDepth];
    int depth = 0;
  };

  // "ranks[2].sequence_lengths" (with indices) or "ranks[].sequence_lengths".
  static std::string PathOf(const Step* path, int depth, const FieldDescriptor* field,
                            bool indices);
  // Records the first bound passed.
  void Over(const std::string& path, int64_t values, const FieldBound& bound, bool per_message);
  // A length-delimited value that `body` reads to its end.
  template <typename Body>
  bool Nested(Body body);
  bool KnownField(const MessagePlan::Field& field, int wire, int64_t* values);
  bool Packed(const MessagePlan::Field& field, int64_t* values);
  // `made`: the parser makes a string object for it (else it reuses one).
  bool String(const MessagePlan::Field& field, bool made);
  bool Unknown(int wire, bool* first_in_message);
  bool Skip(int wire);

  CodedInputStream in_;
  RequestShape& shape_;
  Step path_[RequestBounds::kMaxDepth];
  int depth_ = 0;
  std::map<const FieldDescriptor*, Total> totals_;
  std::vector<const FieldDescriptor*> order_;  // totals_' fields as first met
  absl::Status refusal_;
};

std::string RequestScanner::Walk::PathOf(const Step* path, int depth,
                                         const FieldDescriptor* field, bool indices) {
  std::string out;
  for (int i = 0; i < depth; ++i) {
    absl::StrAppend(&out, path[i].field->name());
    if (path[i].field->is_repeated()) {
      absl::StrAppend(&out, "[", indices ? absl::StrCat(path[i].index) : std::string(), "]");
    }
    out += '.';
  }
  return out + field->name();
}

void RequestScanner::Walk::Over(const std::string& path, int64_t values, const FieldBound& bound,
                                bool per_message) {
  if (!shape_.over_limit.ok()) return;
  const std::string message =
      absl::StrCat(path, ": ", values, " ", bound.unit, " exceed the limit of ",
                   per_message ? bound.per_message : bound.per_request,
                   per_message ? bound.per_message_words : bound.per_request_words);
  shape_.over_limit = per_message && bound.malformed_when_over
                          ? absl::InvalidArgumentError(message)
                          : absl::ResourceExhaustedError(message);
}

template <typename Body>
bool RequestScanner::Walk::Nested(Body body) {
  uint32_t length = 0;
  if (!in_.ReadVarint32(&length) || length > INT_MAX) return false;
  const CodedInputStream::Limit limit = in_.PushLimit(static_cast<int>(length));
  // A body cut short by the end of the input also stops at a tag of 0.
  const bool ok = body() && in_.BytesUntilLimit() == 0;
  in_.PopLimit(limit);
  return ok;
}

bool RequestScanner::Walk::Message(const MessagePlan& plan) {
  // Values of each field in this message (occurrences of a singular one),
  // by field index.
  absl::InlinedVector<int64_t, 16> values(plan.fields.size(), 0);
  bool unknown_seen = false;
  for (;;) {
    const uint32_t tag = in_.ReadTag();
    if (tag == 0) break;
    const uint32_t number = tag >> 3;
    const int wire = static_cast<int>(tag & 7);
    if (number == 0) return false;  // the parser refuses field number 0
    const MessagePlan::Field* field = plan.Find(number);
    if (field == nullptr) {
      if (!Unknown(wire, &unknown_seen)) return false;
      continue;
    }
    const int index = field->descriptor->index();
    if (wire == field->wire) {
      if (!KnownField(*field, wire, &values[index])) return false;
    } else if (field->packable && wire == kWireLengthDelimited) {
      if (!Packed(*field, &values[index])) return false;
    } else if (!Unknown(wire, &unknown_seen)) {  // a known field in another wire form
      return false;
    }
  }
  if (!in_.ConsumedEntireMessage()) return false;
  for (const MessagePlan::Field& field : plan.fields) {
    const int64_t n = values[field.descriptor->index()];
    if (n == 0 || field.bound == nullptr || !field.descriptor->is_repeated()) continue;
    if (n > field.bound->per_message) {
      Over(PathOf(path_, depth_, field.descriptor, /*indices=*/true), n, *field.bound, true);
    }
    Total& total = totals_[field.descriptor];
    if (total.bound == nullptr) {
      total.bound = field.bound;
      std::copy(path_, path_ + depth_, total.path);
      total.depth = depth_;
      order_.push_back(field.descriptor);
    }
    total.values += n;
  }
  return true;
}

bool RequestScanner::Walk::KnownField(const MessagePlan::Field& field, int wire,
                                      int64_t* values) {
  // A singular message or string sent again is merged into (or replaces)
  // the first: its object is made once.
  const bool made = field.descriptor->is_repeated() || *values == 0;
  if (field.message != nullptr) {
    if (depth_ >= RequestBounds::kMaxDepth) return false;  // Covers keeps plans shallower
    path_[depth_++] = Step{field.descriptor, *values};
    ++*values;
    if (made) shape_.parsed_bytes += field.parsed_bytes;
    const bool ok = Nested([&] { return Message(*field.message); });
    --depth_;
    return ok;
  }
  if (wire == kWireLengthDelimited) {
    ++*values;
    return String(field, made);
  }
  if (field.descriptor->is_repeated()) shape_.parsed_bytes += field.parsed_bytes;
  ++*values;
  return Skip(wire);
}

bool RequestScanner::Walk::Packed(const MessagePlan::Field& field, int64_t* values) {
  const int64_t before = *values;
  const bool ok = Nested([&] {
    if (field.fixed_width > 0) {
      const int64_t bytes = in_.BytesUntilLimit();
      *values += (bytes + field.fixed_width - 1) / field.fixed_width;
      return in_.Skip(static_cast<int>(bytes));
    }
    // Each varint's last byte is the one with its top bit clear.
    while (in_.BytesUntilLimit() > 0) {
      const void* data = nullptr;
      int size = 0;
      if (!in_.GetDirectBufferPointer(&data, &size)) return false;
      const auto* bytes = static_cast<const uint8_t*>(data);
      *values += std::count_if(bytes, bytes + size, [](uint8_t b) { return b < 0x80; });
      in_.Skip(size);
    }
    return true;
  });
  shape_.parsed_bytes += (*values - before) * field.parsed_bytes;
  return ok;
}

bool RequestScanner::Walk::String(const MessagePlan::Field& field, bool made) {
  uint32_t length = 0;
  if (!in_.ReadVarint32(&length) || length > INT_MAX) return false;
  if (made) shape_.parsed_bytes += field.parsed_bytes;
  const FieldBound* bound = field.bound;
  const bool over = bound != nullptr && int64_t{length} > bound->per_message;
  if (over) {
    const std::string path = PathOf(path_, depth_, field.descriptor, /*indices=*/true);
    if (bound->names_job) {  // refused unread: no caller is authorized as it
      refusal_ = absl::InvalidArgumentError(absl::StrCat(
          path, ": ", length, " ", bound->unit, " exceed the limit of ", bound->per_message));
      return false;
    }
    Over(path, length, *bound, /*per_message=*/true);
  }
  if (bound != nullptr && bound->names_job && !over) {
    return in_.ReadString(&shape_.job_id, static_cast<int>(length));  // the last one counts
  }
  return in_.Skip(static_cast<int>(length));
}

bool RequestScanner::Walk::Unknown(int wire, bool* first_in_message) {
  if (wire != kWireVarint && wire != kWireFixed64 && wire != kWireLengthDelimited && wire != kWireFixed32) {
    return false;  // a group (3, 4), or no wire type (6, 7)
  }
  ++shape_.unknown_fields;
  shape_.parsed_bytes += kUnknownFieldBytes + (wire == kWireLengthDelimited ? kStringBytes : 0);
  if (!*first_in_message) {
    *first_in_message = true;
    shape_.parsed_bytes += kUnknownFieldSetBytes;
  }
  return Skip(wire);
}

bool RequestScanner::Walk::Skip(int wire) {
  uint64_t value64 = 0;
  uint32_t value32 = 0;
  switch (wire) {
    case kWireVarint: return in_.ReadVarint64(&value64);
    case kWireFixed64: return in_.ReadLittleEndian64(&value64);
    case kWireFixed32: return in_.ReadLittleEndian32(&value32);
    case kWireLengthDelimited:
      return in_.ReadVarint32(&value32) && value32 <= INT_MAX &&
             in_.Skip(static_cast<int>(value32));
    default: return false;
  }
}

void RequestScanner::Walk::CheckTotals() {
  for (const FieldDescriptor* field : order_) {
    const Total& total = totals_[field];
    shape_.values[field] = total.values;
    if (total.bound->per_request >= 0 && total.values > total.bound->per_request) {
      Over(PathOf(total.path, total.depth, field, /*indices=*/false), total.values,
           *total.bound, /*per_message=*/false);
    }
  }
}

RequestScanner::RequestScanner(const ServiceLimits& limits) : bounds_(limits) {
  for (const Descriptor* request : ScannedRequests()) PlanOf(request);
}

RequestScanner::~RequestScanner() = default;

const RequestScanner::MessagePlan& RequestScanner::PlanOf(const Descriptor* message) {
  auto found = plans_.find(message);
  if (found != plans_.end()) return *found->second;
  MessagePlan& plan = *plans_.emplace(message, std::make_unique<MessagePlan>()).first->second;
  plan.descriptor = message;
  plan.fields.resize(message->field_count());
  for (int i = 0; i < message->field_count(); ++i) {
    const FieldDescriptor* descriptor = message->field(i);
    MessagePlan::Field& field = plan.fields[i];
    const ValueForm form = ValueFormOf(descriptor);
    field.descriptor = descriptor;
    field.wire = form.wire_type;
    field.bound = bounds_.Of(descriptor);
    if (descriptor->type() == FieldDescriptor::TYPE_MESSAGE) {
      field.message = &PlanOf(descriptor->message_type());
      field.parsed_bytes = ObjectBytes(descriptor->message_type()) + kArenaObjectBytes +
                           (descriptor->is_repeated() ? kGrowth * int64_t{sizeof(void*)} : 0);
    } else if (field.wire == kWireLengthDelimited) {
      field.parsed_bytes =
          kStringBytes + (descriptor->is_repeated() ? kGrowth * int64_t{sizeof(void*)} : 0);
    } else if (descriptor->is_repeated()) {
      field.packable = descriptor->is_packable();
      field.fixed_width = field.wire == kWireVarint ? 0 : form.widest_bytes;
      field.parsed_bytes = kGrowth * form.array_bytes;
    }
    // RequestBounds::Covers keeps numbers within the table.
    const size_t number = static_cast<size_t>(descriptor->number());
    if (number <= RequestBounds::kMaxFieldNumber) {
      if (plan.by_number.size() <= number) plan.by_number.resize(number + 1, -1);
      plan.by_number[number] = i;
    }
  }
  return plan;
}

absl::StatusOr<RequestShape> RequestScanner::Scan(
    const Descriptor* message, google::protobuf::io::ZeroCopyInputStream* input) const {
  auto plan = plans_.find(message);
  if (plan == plans_.end()) {
    return absl::InternalError(absl::StrCat("request scan: ", message->full_name(),
                                            " is not a scanned request"));
  }
  RequestShape shape;
  shape.message = message;
  Walk walk(input, &shape);
  if (!walk.Message(*plan->second)) {
    if (!walk.refusal().ok()) return walk.refusal();
    return absl::InvalidArgumentError(absl::StrCat("request: not a valid ", message->name(),
                                                   " (malformed at byte ", walk.position(),
                                                   ")"));
  }
  walk.CheckTotals();
  shape.wire_bytes = walk.position();
  return shape;
}

int64_t EstimatedParsedBytes(const RequestShape& shape) {
  return kCallBytes + shape.wire_bytes + shape.parsed_bytes;
}

int64_t MaxRequestWireBytes(const ServiceLimits& limits) {
  const RequestBounds bounds(limits);
  int64_t largest = 0;
  for (const Descriptor* request : ScannedRequests()) {
    largest = std::max(largest, bounds.MaxWireBytes(request));
  }
  return std::min<int64_t>(largest, INT_MAX);
}

int ReceiveLimitBytes(const ServiceLimits& limits) {
  if (limits.max_message_bytes > 0) return limits.max_message_bytes;
  return static_cast<int>(MaxRequestWireBytes(limits));
}

}  // namespace knapformer
