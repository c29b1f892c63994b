// What a group's ranks tell each other (client/rank_report.proto), from a
// peer that sends any bytes: the first byte is the number of ranks (1-8),
// then each rank's report as a length byte and that many bytes. What every
// rank concludes from them (Digest: calls, verdicts, specs, lengths and
// masks; each outcome's check; per-rank mode's fingerprints) is decided
// without reading or writing out of bounds (ASan) or overflowing (UBSan),
// and what Digest accepts is whole: one length list per rank.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "client/rank_report.h"
#include "client/rank_report.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "planner/plan_fingerprint.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace knapformer;
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  if (size < 1) return 0;
  const int ranks = 1 + (data[0] & 7);
  std::vector<client::RankReport> reports(ranks);
  size_t at = 1;
  for (int r = 0; r < ranks; ++r) {
    if (at >= size) return 0;
    const size_t length = data[at++];
    if (length > size - at) return 0;
    if (!reports[r].ParseFromArray(data + at, static_cast<int>(length))) return 0;
    at += length;
  }
  std::vector<PlanFingerprint> fingerprints;
  for (int r = 0; r < ranks; ++r) {
    const client::StepOutcome& o = reports[r].outcome();
    (void)CheckOutcome(o, r);
    fingerprints.push_back(FingerprintFromProto(o.fingerprint()));
  }
  (void)CheckFingerprints(fingerprints);
  (void)CheckCalls(reports, /*all_alike=*/false);
  absl::StatusOr<Gathered> gathered = Digest(reports, data[0] >> 3);
  if (!gathered.ok()) return 0;
  fuzz::Require(static_cast<int>(gathered->lengths.size()) == ranks &&
                    static_cast<int>(gathered->timings.size()) == ranks,
                "an accepted gathering has every rank's lengths and timing");
  for (int r = 0; r < ranks; ++r) {
    fuzz::Require(static_cast<int>(gathered->lengths[r].size()) ==
                      reports[r].lengths().sequence_lengths_size(),
                  "each rank's lengths are its report's");
  }
  fuzz::Require(gathered->masks.empty() || static_cast<int>(gathered->masks.size()) == ranks,
                "masks are every rank's or none");
  return 0;
}
