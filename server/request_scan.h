#ifndef KNAPFORMER_SERVER_REQUEST_SCAN_H_
#define KNAPFORMER_SERVER_REQUEST_SCAN_H_

// What a Plan or PlanGroup request holds, counted from its wire form without
// parsing it. Parsing can cost far more memory than the bytes sent (a zero
// length is one byte on the wire and eight parsed, an empty mask two bytes
// and a message of ~100), and gRPC would parse a whole request before any
// check ran: the service receives the bytes, scans them, refuses a request
// over the limits or over its share of memory, and parses only what it
// admitted. The scan allocates nothing but the job id.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "server/service_limits.h"

namespace knapformer {

struct RequestShape {
  // A PlanGroupRequest (else a PlanRequest).
  bool group = false;
  // spec.job_id as the parser will set it (the last one sent).
  std::string job_id;
  int64_t wire_bytes = 0;
  // PlanGroupRequest.ranks and .previous entries (a PlanRequest: 1 and 0).
  int64_t ranks = 0;
  int64_t timings = 0;
  // Over all timings: attention_by_pair_point values.
  int64_t timing_weights = 0;
  // Over all ranks: sequence lengths, attention masks, and the masks'
  // span_lengths and span_causal entries.
  int64_t sequences = 0;
  int64_t masks = 0;
  int64_t span_lengths = 0;
  int64_t span_flags = 0;
  // The most sequences one rank gives, and the first rank giving that many.
  int64_t rank_sequences = 0;
  int64_t fullest_rank = 0;
  // Fields this server's messages do not have (kept by the parser).
  int64_t unknown_fields = 0;
};

// Scans a serialized knapformer.v1.PlanRequest / PlanGroupRequest:
// INVALID_ARGUMENT when it is not one (naming the byte) or its job id is
// longer than any valid one.
absl::StatusOr<RequestShape> ScanPlanRequest(google::protobuf::io::ZeroCopyInputStream* input);
absl::StatusOr<RequestShape> ScanPlanGroupRequest(
    google::protobuf::io::ZeroCopyInputStream* input);

// RESOURCE_EXHAUSTED when the request holds more than `limits` admit
// (naming the field and the limit).
absl::Status CheckRequestShape(const RequestShape& shape, const ServiceLimits& limits);

// At least the memory that parsing a request of `shape` takes (onto an arena,
// with the heap its unknown fields use), growth of repeated fields included.
int64_t EstimatedParsedBytes(const RequestShape& shape);

// The largest Plan or PlanGroup request, in bytes on the wire, that `limits`
// admit (counts and ids at their limits, every value at its widest): what
// `--max-message-bytes` 0 gives gRPC as its receive limit.
int64_t MaxRequestWireBytes(const ServiceLimits& limits);

// gRPC's receive limit: limits.max_message_bytes, or where that is 0,
// MaxRequestWireBytes.
int ReceiveLimitBytes(const ServiceLimits& limits);

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_REQUEST_SCAN_H_
