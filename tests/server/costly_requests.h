#ifndef KNAPFORMER_TESTS_SERVER_COSTLY_REQUESTS_H_
#define KNAPFORMER_TESTS_SERVER_COSTLY_REQUESTS_H_

// Requests built to cost a parser the most memory per byte sent: for every
// field of every message a request holds (found by walking the request
// messages' descriptors, so a field added to the schema gets its own), that
// field many times in its costliest form, and unknown fields inside every
// message. For the scan's memory estimate (request_scan_test) and the
// request fuzzers' seeds (tests/fuzz/make_seeds.cc).

#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"

namespace knapformer::testing_util {

struct CostlyRequest {
  const google::protobuf::Descriptor* request = nullptr;
  // "PlanGroupRequest.ranks.attention_masks: empty messages"
  std::string name;
  std::string bytes;
};

// For each request of ScannedRequests() (server/request_bounds.h), each
// message type it holds (reached through one instance of each message on
// the way) and each repeated, string or message field of it: `values`
// occurrences in the costliest form (packed zero varints, zero fixed
// values, empty messages, empty strings); and per message, `values` unknown
// varint fields and `values` unknown empty length-delimited fields.
std::vector<CostlyRequest> CostlyRequests(int values);

}  // namespace knapformer::testing_util

#endif  // KNAPFORMER_TESTS_SERVER_COSTLY_REQUESTS_H_
