#ifndef KNAPFORMER_TOOLS_CALIBRATE_H_
#define KNAPFORMER_TOOLS_CALIBRATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/calibration.h"
#include "planner/exchange_fit.h"

namespace knapformer {

// `knapformer calibrate --input FILE|- --d-model D`: fits k and gamma from a
// CSV of "length,seconds[,mask]" rows (one timed transformer block per
// sequence length, attending with `mask` (MaskText's form; default full):
// the fit prices its attention by the pairs attended; a header row and #
// comments are skipped) and prints the fit.
// Its usage text (--help).
std::string CalibrateUsage();

// Parses the CSV into samples; InvalidArgument naming the line otherwise.
absl::StatusOr<std::vector<WorkSample>> ParseTimingCsv(const std::string& text, int64_t d_model);

// `knapformer calibrate --exchanges FILE|-`: rows "gpus,bytes_per_gpu,seconds,link"
// (one timed all-to-all in a bag of `gpus` GPUs, each holding bytes_per_gpu
// for it; link is intra or inter), as bench/exchange_times.py writes them.
// InvalidArgument naming the line otherwise.
absl::StatusOr<std::vector<ExchangeSample>> ParseExchangeCsv(const std::string& text);

// Exit code 0, or 2 with a one-line error on stderr.
int RunCalibrate(const std::vector<std::string>& argv);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_CALIBRATE_H_
