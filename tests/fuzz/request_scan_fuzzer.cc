// Any bytes as a Plan, PlanGroup or GetJob request (the first byte picks
// which), as they come off the network: the wire scan (server/request_scan.h)
// refuses them as malformed or scans them; where protobuf's parser takes
// them too, the scan agrees with it: the same job id, the same number of
// values in every repeated field of every nested message, and a memory
// estimate at least what the parsed message holds. The seeds are each
// field's costliest form (tests/server/costly_requests.h).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "server/request_bounds.h"
#include "server/request_scan.h"
#include "server/service_limits.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/server/parsed_values.h"

namespace {

// The job id a parsed request names: its own job_id, or its spec's.
std::string JobIdOf(const google::protobuf::Message& request) {
  const google::protobuf::Descriptor* descriptor = request.GetDescriptor();
  const google::protobuf::Reflection* reflection = request.GetReflection();
  if (const auto* job = descriptor->FindFieldByName("job_id")) {
    return reflection->GetString(request, job);
  }
  const auto* spec = descriptor->FindFieldByName("spec");
  const google::protobuf::Message& inner = reflection->GetMessage(request, spec);
  return inner.GetReflection()->GetString(inner, inner.GetDescriptor()->FindFieldByName("job_id"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace knapformer;
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  if (size == 0) return 0;
  static const RequestScanner* const scanner = new RequestScanner(ServiceLimits());
  const auto& requests = ScannedRequests();
  const google::protobuf::Descriptor* message = requests[data[0] % requests.size()];
  const int length = static_cast<int>(size - 1);
  google::protobuf::io::ArrayInputStream input(data + 1, length, /*block_size=*/7);
  absl::StatusOr<RequestShape> shape = scanner->Scan(message, &input);
  std::unique_ptr<google::protobuf::Message> parsed(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(message)->New());
  const bool parses = parsed->ParseFromArray(data + 1, length);
  if (!shape.ok()) {
    fuzz::Require(shape.status().code() == absl::StatusCode::kInvalidArgument,
                  "a refused scan is INVALID_ARGUMENT", shape.status().ToString());
    return 0;
  }
  fuzz::Require(shape->wire_bytes == length, "the scan reads every byte");
  if (!parses) return 0;  // a string that is not UTF-8: the parser alone refuses it
  fuzz::Require(shape->job_id == JobIdOf(*parsed), "the scan's job id is the parser's");
  fuzz::Require(shape->values == testing_util::ParsedValues(*parsed),
                "the scan counts every repeated field as the parser fills it");
  fuzz::Require(EstimatedParsedBytes(*shape) >= static_cast<int64_t>(parsed->SpaceUsedLong()),
                "the memory estimate bounds the parsed message");
  return 0;
}
