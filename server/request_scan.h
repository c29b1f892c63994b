#ifndef KNAPFORMER_SERVER_REQUEST_SCAN_H_
#define KNAPFORMER_SERVER_REQUEST_SCAN_H_

// What a request holds, counted from its wire form without parsing it.
// Parsing can cost far more memory than the bytes sent (a zero length is one
// byte on the wire and eight parsed, an unknown field two bytes and an entry
// of sixteen in a growing array), and gRPC would parse a whole request
// before any check ran: the service receives the bytes, scans them, refuses
// a request over the limits or over its share of memory, and parses only
// what it admitted.
//
// The scan follows the request messages' descriptors, as protobuf's parser
// does: every field of every nested message is read by its type, every
// unknown field (one the server's messages do not have, or a known one sent
// with another wire type) is counted at what the parser keeps of it, and
// every repeated and string field is held to its bound (request_bounds.h).
// Nothing in it names a field number.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "server/request_bounds.h"
#include "server/service_limits.h"

namespace knapformer {

struct RequestShape {
  // The request's message type.
  const google::protobuf::Descriptor* message = nullptr;
  // The job it names, as the parser will set it (the last one sent).
  std::string job_id;
  int64_t wire_bytes = 0;
  // At least the heap and arena that parsing it onto an arena takes, growth
  // of repeated fields included (not counting the wire bytes).
  int64_t parsed_bytes = 0;
  int64_t unknown_fields = 0;
  // The first bound the request passes, naming the field where it is
  // ("ranks[2].sequence_lengths: 70000 sequences exceed the limit of 65536
  // per rank"): RESOURCE_EXHAUSTED for a count, INVALID_ARGUMENT for a
  // malformed size. OK when it passes none.
  absl::Status over_limit;
  // Values of each bounded repeated field over the whole request (fields
  // the request does not give are absent).
  std::map<const google::protobuf::FieldDescriptor*, int64_t> values;
};

// The scan of one server's limits. Immutable; thread-safe.
class RequestScanner {
 public:
  explicit RequestScanner(const ServiceLimits& limits);
  ~RequestScanner();

  // Scans a serialized `message` (one of ScannedRequests()). INVALID_ARGUMENT
  // when the bytes are not one (naming the byte), or when the job id it
  // names is longer than any valid one (the job is not read).
  absl::StatusOr<RequestShape> Scan(const google::protobuf::Descriptor* message,
                                    google::protobuf::io::ZeroCopyInputStream* input) const;

  const RequestBounds& bounds() const { return bounds_; }

 private:
  struct MessagePlan;
  class Walk;
  const MessagePlan& PlanOf(const google::protobuf::Descriptor* message);

  const RequestBounds bounds_;
  std::map<const google::protobuf::Descriptor*, std::unique_ptr<MessagePlan>> plans_;
};

// At least the memory that holding and parsing a request of `shape` takes:
// its wire bytes, what parsing them allocates, and a call's fixed part.
int64_t EstimatedParsedBytes(const RequestShape& shape);

// The largest request of any scanned kind, in bytes on the wire, that
// `limits` admit (RequestBounds::MaxWireBytes): what `--max-message-bytes`
// 0 gives gRPC as its receive limit.
int64_t MaxRequestWireBytes(const ServiceLimits& limits);

// gRPC's receive limit: limits.max_message_bytes, or where that is 0,
// MaxRequestWireBytes.
int ReceiveLimitBytes(const ServiceLimits& limits);

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_REQUEST_SCAN_H_
