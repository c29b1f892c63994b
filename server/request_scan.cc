#include "server/request_scan.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/measured_cost.h"
#include "planner/measured_fit.h"

namespace knapformer {
namespace {

using google::protobuf::io::CodedInputStream;

// Wire types (protobuf's encoding). Groups (3, 4) are in no knapformer message.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kFixed32 = 5;

// Walks one request's fields as protobuf's parser would take them, counting
// what parsing would allocate. Every method returns false on bytes the parser
// would refuse too.
class Scanner {
 public:
  explicit Scanner(google::protobuf::io::ZeroCopyInputStream* input) : in_(input) {}

  bool PlanRequest() {
    int64_t lengths = 0;
    const bool ok = Fields([&](uint32_t number, int wire) {
      switch (number) {
        case 1: return Message(wire, [&] { return Spec(); });
        case 2: return Scalar(wire, kVarint);  // rank
        case 3: return Repeated(wire, &lengths);
        case 4: return Message(wire, [&] { return Timing(); });  // previous (one)
        case 5: return Message(wire, [&] { return Mask(); });
        default: return Unknown(wire);
      }
    });
    shape_.ranks = 1;
    shape_.sequences = shape_.rank_sequences = lengths;
    return ok;
  }

  bool PlanGroupRequest() {
    return Fields([&](uint32_t number, int wire) {
      switch (number) {
        case 1: return Message(wire, [&] { return Spec(); });
        case 2: return Message(wire, [&] { return RankLengths(); });
        case 3: return Scalar(wire, kVarint);  // include_rank_plans
        case 4: return Message(wire, [&] {
          ++shape_.timings;
          return Timing();
        });
        default: return Unknown(wire);
      }
    });
  }

  RequestShape& shape() { return shape_; }
  int64_t position() const { return in_.CurrentPosition(); }
  // A job id longer than the limit (its length; 0 = none).
  uint32_t long_job_id() const { return long_job_id_; }

 private:
  // Reads fields up to the current limit (or the end of the input), calling
  // `field(number, wire_type)` to read each one's value.
  template <typename Field>
  bool Fields(Field field) {
    for (;;) {
      const uint32_t tag = in_.ReadTag();
      if (tag == 0) return in_.ConsumedEntireMessage();
      if (!field(tag >> 3, static_cast<int>(tag & 7))) return false;
    }
  }

  // A length-delimited value that `body` reads to its end.
  template <typename Body>
  bool Nested(Body body) {
    uint32_t length = 0;
    if (!in_.ReadVarint32(&length) || length > INT_MAX) return false;
    const CodedInputStream::Limit limit = in_.PushLimit(static_cast<int>(length));
    // A body cut short by the end of the input also stops at a tag of 0.
    const bool ok = body() && in_.BytesUntilLimit() == 0;
    in_.PopLimit(limit);
    return ok;
  }

  // A message field: a nested message, or (any other wire type) unknown.
  template <typename Body>
  bool Message(int wire, Body body) {
    return wire == kLengthDelimited ? Nested(body) : Unknown(wire);
  }

  // A singular field of wire type `expected`; the parser keeps one sent with
  // another wire type as an unknown field.
  bool Scalar(int wire, int expected) { return wire == expected ? Skip(wire) : Unknown(wire); }

  // A repeated int64 or bool: packed (one length-delimited run) or one value.
  bool Repeated(int wire, int64_t* count) {
    if (wire == kVarint) {
      ++*count;
      return Skip(wire);
    }
    if (wire != kLengthDelimited) return Unknown(wire);
    return Nested([&] {
      // Each value's last byte is the one with its top bit clear.
      while (in_.BytesUntilLimit() > 0) {
        const void* data = nullptr;
        int size = 0;
        if (!in_.GetDirectBufferPointer(&data, &size)) return false;
        const auto* bytes = static_cast<const uint8_t*>(data);
        *count += std::count_if(bytes, bytes + size, [](uint8_t b) { return b < 0x80; });
        in_.Skip(size);
      }
      return true;
    });
  }

  bool Unknown(int wire) {
    ++shape_.unknown_fields;
    return Skip(wire);
  }

  bool Skip(int wire) {
    uint64_t value64 = 0;
    uint32_t value32 = 0;
    switch (wire) {
      case kVarint: return in_.ReadVarint64(&value64);
      case kFixed64: return in_.ReadLittleEndian64(&value64);
      case kFixed32: return in_.ReadLittleEndian32(&value32);
      case kLengthDelimited:
        return in_.ReadVarint32(&value32) && value32 <= INT_MAX &&
               in_.Skip(static_cast<int>(value32));
      default: return false;
    }
  }

  bool Spec() {
    return Fields([&](uint32_t number, int wire) {
      switch (number) {
        case 1: return JobId(wire);
        case 2: case 5: return Scalar(wire, kLengthDelimited);  // group_id, topology
        case 3: case 4: case 6: case 8: case 9: case 10: case 11: case 12:
          return Scalar(wire, kVarint);
        case 7: case 13: return Scalar(wire, kFixed64);  // gamma, incarnation
        case 14: return Message(wire, [&] { return Machine(); });
        default: return Unknown(wire);
      }
    });
  }

  bool JobId(int wire) {
    if (wire != kLengthDelimited) return Unknown(wire);
    uint32_t length = 0;
    if (!in_.ReadVarint32(&length) || length > INT_MAX) return false;
    if (length > kMaxIdLength) {  // refused unread
      long_job_id_ = length;
      return in_.Skip(static_cast<int>(length));
    }
    long_job_id_ = 0;  // the last one counts
    return in_.ReadString(&shape_.job_id, static_cast<int>(length));
  }

  bool Machine() {
    return Fields([&](uint32_t number, int wire) {
      switch (number) {
        case 1: case 2: case 3: return Scalar(wire, kFixed64);  // speeds
        case 4: case 5: case 6: return Scalar(wire, kVarint);
        default: return Unknown(wire);
      }
    });
  }

  bool Timing() {
    return Fields([&](uint32_t number, int wire) {
      switch (number) {
        case 1: return Scalar(wire, kVarint);  // step
        case 2: case 3: case 4: return Scalar(wire, kFixed64);
        case 5: return Floats(wire, &shape_.timing_weights);  // attention_by_pair_point
        default: return Unknown(wire);
      }
    });
  }

  // A repeated float: packed (4 bytes a value) or one value.
  bool Floats(int wire, int64_t* count) {
    if (wire == kFixed32) {
      ++*count;
      return Skip(wire);
    }
    if (wire != kLengthDelimited) return Unknown(wire);
    uint32_t length = 0;
    if (!in_.ReadVarint32(&length) || length > INT_MAX) return false;
    *count += length / 4;
    return in_.Skip(static_cast<int>(length));
  }

  bool Mask() {
    ++shape_.masks;
    return Fields([&](uint32_t number, int wire) {
      switch (number) {
        case 1: case 2: return Scalar(wire, kVarint);  // kind, window
        case 3: return Repeated(wire, &shape_.span_lengths);
        case 4: return Repeated(wire, &shape_.span_flags);
        default: return Unknown(wire);
      }
    });
  }

  bool RankLengths() {
    int64_t lengths = 0;
    const bool ok = Fields([&](uint32_t number, int wire) {
      switch (number) {
        case 1: return Repeated(wire, &lengths);
        case 2: return Message(wire, [&] { return Mask(); });
        default: return Unknown(wire);
      }
    });
    if (lengths > shape_.rank_sequences) {
      shape_.rank_sequences = lengths;
      shape_.fullest_rank = shape_.ranks;
    }
    shape_.sequences += lengths;
    ++shape_.ranks;
    return ok;
  }

  CodedInputStream in_;
  RequestShape shape_;
  uint32_t long_job_id_ = 0;
};

absl::Status TooMany(const std::string& field, int64_t count, const char* what, int64_t limit,
                     const char* per) {
  return absl::ResourceExhaustedError(absl::StrCat(field, ": ", count, " ", what,
                                                   " exceed the limit of ", limit, per));
}

absl::StatusOr<RequestShape> Scan(google::protobuf::io::ZeroCopyInputStream* input, bool group) {
  Scanner scanner(input);
  const bool ok = group ? scanner.PlanGroupRequest() : scanner.PlanRequest();
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: not a valid ", group ? "PlanGroupRequest" : "PlanRequest",
                     " (malformed at byte ", scanner.position(), ")"));
  }
  if (scanner.long_job_id() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.job_id: ", scanner.long_job_id(),
                                                   " characters exceed the limit of ",
                                                   kMaxIdLength));
  }
  RequestShape& shape = scanner.shape();
  shape.group = group;
  shape.wire_bytes = scanner.position();
  return std::move(shape);
}

}  // namespace

absl::Status CheckRequestShape(const RequestShape& shape, const ServiceLimits& limits) {
  const bool group = shape.group;
  if (group && shape.ranks > limits.max_world_size) {
    return TooMany("ranks", shape.ranks, "entries", limits.max_world_size, " ranks");
  }
  if (group && shape.timings > limits.max_world_size) {
    return TooMany("previous", shape.timings, "entries", limits.max_world_size, " ranks");
  }
  const int64_t max_weights = (group ? shape.timings : 1) * kPairGridPoints;
  if (shape.timing_weights > max_weights) {
    return TooMany("previous.attention_by_pair_point", shape.timing_weights, "values",
                   max_weights, " (one per grid point per timing)");
  }
  if (shape.rank_sequences > limits.max_sequences_per_rank) {
    return TooMany(group ? absl::StrCat("ranks[", shape.fullest_rank, "].sequence_lengths")
                         : std::string("sequence_lengths"),
                   shape.rank_sequences, "sequences", limits.max_sequences_per_rank,
                   " per rank");
  }
  if (shape.sequences > limits.max_sequences_per_step) {
    return TooMany(group ? "ranks" : "sequence_lengths", shape.sequences, "sequences",
                   limits.max_sequences_per_step, " per step");
  }
  const std::string masks = group ? "ranks[].attention_masks" : "attention_masks";
  const int64_t max_masks = group ? limits.max_sequences_per_step : limits.max_sequences_per_rank;
  if (shape.masks > max_masks) {
    return TooMany(masks, shape.masks, "masks", max_masks,
                   group ? " per step (one per sequence)" : " per rank (one per sequence)");
  }
  const int64_t spans = std::max(shape.span_lengths, shape.span_flags);
  if (spans > limits.max_mask_spans_per_step) {
    return TooMany(masks, spans, "spans", limits.max_mask_spans_per_step, " per step");
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestShape> ScanPlanRequest(google::protobuf::io::ZeroCopyInputStream* input) {
  return Scan(input, /*group=*/false);
}

absl::StatusOr<RequestShape> ScanPlanGroupRequest(
    google::protobuf::io::ZeroCopyInputStream* input) {
  return Scan(input, /*group=*/true);
}

int64_t EstimatedParsedBytes(const RequestShape& shape) {
  // A repeated field grows by doubling and an arena keeps the arrays it
  // outgrew: at most 4 times its final size in all. Unknown fields live on
  // the heap, each an entry of a vector that grows alike. The wire bytes
  // cover strings and unknown fields' payloads; the fixed part, the
  // messages that are there once and the arena's first blocks.
  // request_scan_test measures parses against this.
  constexpr int64_t kGrowth = 4;
  constexpr int64_t kPointer = sizeof(void*);
  constexpr int64_t kUnknownField = 16;
  constexpr int64_t kFixed = 16 << 10;
  return kFixed + shape.wire_bytes + kGrowth * (8 * shape.sequences + 8 * shape.span_lengths +
                                                shape.span_flags + 4 * shape.timing_weights +
                                                kUnknownField * shape.unknown_fields) +
         shape.masks * (sizeof(v1::AttentionMask) + kGrowth * kPointer) +
         shape.ranks * (sizeof(v1::RankLengths) + kGrowth * kPointer) +
         shape.timings * (sizeof(v1::StepTiming) + kGrowth * kPointer);
}

int64_t MaxRequestWireBytes(const ServiceLimits& limits) {
  // Widest encodings: a tag and a length prefix take at most 1 + 5 bytes, a
  // length (under 2^31) 5, a varint 10, a double 8. Repeated values packed,
  // as every protobuf encoder does for proto3 (an unpacked one adds a tag
  // per value, and a request that needs the room is refused).
  constexpr int64_t kField = 6;
  constexpr int64_t kLength = 5;
  constexpr int64_t kTiming =
      kField + 11 + 3 * 9 + kField + 4 * kPairGridPoints;  // StepTiming
  constexpr int64_t kMask = kField + 2 * 11 + 2 * kField;             // kind, window, 2 runs
  constexpr int64_t kRank = kField + kField + kTiming;                // RankLengths, previous
  // The measured cost model's table: two packed runs of doubles.
  constexpr int64_t kTable = kField + 2 * (kField + 8 * MeasuredAttention::kMaxPoints);
  constexpr int64_t kSpecFixed = kField + 2 * (kField + kMaxIdLength) + 12 * 11 + kField +
                                 6 * 11 + kTable;  // ids, scalars, machine, table
  // The topology string: at most one bag term ("g1n1+") per rank, and a few.
  const int64_t spec = kSpecFixed + kField + 8 * (int64_t{limits.max_world_size} + 4);
  const int64_t bytes = spec + kRank * limits.max_world_size +
                        (kLength + kMask) * limits.max_sequences_per_step +
                        (kLength + 1) * limits.max_mask_spans_per_step + 64;
  return std::min<int64_t>(bytes, INT_MAX);
}

int ReceiveLimitBytes(const ServiceLimits& limits) {
  if (limits.max_message_bytes > 0) return limits.max_message_bytes;
  return static_cast<int>(MaxRequestWireBytes(limits));
}

}  // namespace knapformer
