#ifndef KNAPFORMER_SERVER_REQUEST_BOUNDS_H_
#define KNAPFORMER_SERVER_REQUEST_BOUNDS_H_

// What a request may hold under a server's limits: for every repeated field
// of a request message, how many values one message and one whole request
// may give it, and for every string field how many characters. The wire scan
// (request_scan.h) counts against these before a request is parsed, and the
// receive limit is derived from them (the largest request they admit), both
// by walking the messages' descriptors: a field added to a request message is
// scanned, charged and sized like the others, and one added without a bound
// here is caught by Covers (request_scan_test walks every request message).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "server/service_limits.h"

namespace knapformer {

// A bound on one field. Refusals read "<path>: <n> <unit> exceed the limit
// of <limit><words>", e.g. "ranks[2].sequence_lengths: 70000 sequences
// exceed the limit of 65536 per rank".
struct FieldBound {
  // Values (characters of a string) in one message holding the field; in
  // the whole request, summed over every message holding it (-1: only the
  // first bound applies).
  int64_t per_message = 0;
  int64_t per_request = -1;
  const char* unit = "values";
  const char* per_message_words = "";
  const char* per_request_words = "";
  // Over a string's bound is a malformed request (INVALID_ARGUMENT); over a
  // count, one too large for this server (RESOURCE_EXHAUSTED).
  bool malformed_when_over = false;
  // The field names the job the request acts as (StepSpec.job_id,
  // GetJobRequest.job_id): read by the scan, and refused unread when over
  // its bound, before the caller is authorized as that job.
  bool names_job = false;
};

// The bounds of one server's limits. Immutable; thread-safe.
class RequestBounds {
 public:
  explicit RequestBounds(const ServiceLimits& limits);

  // Null for a field without a bound (a singular scalar or message).
  const FieldBound* Of(const google::protobuf::FieldDescriptor* field) const;

  // OK when the scan accounts for every field of `root` and of every message
  // it holds: each repeated and each string field has a bound, none is a
  // group or a map, field numbers are at most kMaxFieldNumber, and messages
  // nest at most kMaxDepth deep. Else Internal naming every field it does
  // not.
  absl::Status Covers(const google::protobuf::Descriptor* root) const;

  // The largest serialized `root` these bounds admit: every bounded field at
  // its bound (a request's total shared out as widely as the messages
  // holding it allow), every value at its widest encoding, repeated scalars
  // packed (as every proto3 encoder sends them; an unpacked request needing
  // the room is refused). REQUIRES: Covers(root) is OK.
  int64_t MaxWireBytes(const google::protobuf::Descriptor* root) const;

  // Nesting of request messages the scan follows (the root is depth 1),
  // and the largest field number its tables hold.
  static constexpr int kMaxDepth = 8;
  static constexpr int kMaxFieldNumber = 1023;

 private:
  std::map<const google::protobuf::FieldDescriptor*, FieldBound> bounds_;
};

// Protobuf's wire types (groups, 3 and 4, are in no request message).
inline constexpr int kWireVarint = 0;
inline constexpr int kWireFixed64 = 1;
inline constexpr int kWireLengthDelimited = 2;
inline constexpr int kWireFixed32 = 5;

// How one value of a field travels and is held: its wire type (-1 for a
// group), its widest encoding (scalars), and its bytes in a parsed
// repeated array (scalars).
struct ValueForm {
  int wire_type = 0;
  int64_t widest_bytes = 0;
  int64_t array_bytes = 0;
};
ValueForm ValueFormOf(const google::protobuf::FieldDescriptor* field);

// The request messages the service reads from the wire: PlanRequest,
// PlanGroupRequest, GetJobRequest.
const std::vector<const google::protobuf::Descriptor*>& ScannedRequests();

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_REQUEST_BOUNDS_H_
