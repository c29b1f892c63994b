// `knapformer calibrate`'s CSV (any text; the first byte picks d_model):
// parsed into samples or refused naming the line; samples are finite and
// non-negative; a fit, when there is one, has finite k and gamma.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "planner/calibration.h"
#include "tests/fuzz/fuzz_check.h"
#include "tools/calibrate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace knapformer;
  if (size < 1) return 0;
  const int64_t d_model = 1 + data[0] * 257;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<std::vector<WorkSample>> samples = ParseTimingCsv(text, d_model);
  if (!samples.ok()) {
    fuzz::Require(absl::IsInvalidArgument(samples.status()) &&
                      !samples.status().message().empty(),
                  "a refused CSV is InvalidArgument with a message", samples.status().ToString());
    return 0;
  }
  for (const WorkSample& s : *samples) {
    fuzz::Require(std::isfinite(s.linear) && std::isfinite(s.attention) &&
                      std::isfinite(s.seconds) && s.linear >= 0 && s.attention >= 0 &&
                      s.seconds >= 0,
                  "samples are finite and non-negative");
  }
  absl::StatusOr<CostFit> fit = FitCostModel(*samples);
  if (fit.ok()) {
    fuzz::Require(std::isfinite(fit->k) && std::isfinite(fit->gamma), "a fit is finite");
  }
  return 0;
}
