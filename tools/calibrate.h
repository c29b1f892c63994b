#ifndef KNAPFORMER_TOOLS_CALIBRATE_H_
#define KNAPFORMER_TOOLS_CALIBRATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/calibration.h"

namespace knapformer {

// `knapformer calibrate --input FILE|- --d-model D`: fits k and gamma from a
// CSV of "length,seconds" rows (one timed transformer block per sequence
// length; a header row and # comments are skipped) and prints the fit.
extern const char kCalibrateUsage[];

// Parses the CSV into samples; InvalidArgument naming the line otherwise.
absl::StatusOr<std::vector<WorkSample>> ParseTimingCsv(const std::string& text, int64_t d_model);

// Exit code 0, or 2 with a one-line error on stderr.
int RunCalibrate(const std::vector<std::string>& argv);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_CALIBRATE_H_
