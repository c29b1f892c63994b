#include "tools/calibrate.h"

#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner/cost_model.h"
#include "tools/args.h"

namespace knapformer {

const char kCalibrateUsage[] =
    "  calibrate --input FILE|- --d-model D\n"
    "            Fit the cost model's k and gamma (least squares, as in the paper) to\n"
    "            measured block latencies: CSV rows \"length,seconds\".\n";

absl::StatusOr<std::vector<WorkSample>> ParseTimingCsv(const std::string& text, int64_t d_model) {
  std::vector<WorkSample> samples;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    int64_t length = 0;
    double seconds = 0;
    const bool numeric = fields.size() == 2 &&
                         absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[0]), &length) &&
                         absl::SimpleAtod(absl::StripAsciiWhitespace(fields[1]), &seconds);
    if (!numeric) {
      if (samples.empty() && line_number == 1) continue;  // a header
      return absl::InvalidArgumentError(absl::StrCat(
          "--input: line ", line_number, ": expected \"length,seconds\", got \"", line, "\""));
    }
    // SimpleAtod reads "2e9400" as infinity: a time, like a NaN, that no fit
    // can use.
    if (length < 1 || length > CostModel::kMaxLength || !(seconds >= 0) ||
        !std::isfinite(seconds)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--input: line ", line_number, ": length must be in [1, ", CostModel::kMaxLength,
          "] and seconds finite and >= 0"));
    }
    samples.push_back(SequenceSample(length, d_model, seconds));
  }
  return samples;
}

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "knapformer: " << status.message() << "\n";
  return 2;
}

}  // namespace

int RunCalibrate(const std::vector<std::string>& argv) {
  auto args = Args::Parse(argv, {"input", "d-model"});
  if (!args.ok()) return Fail(args.status());
  if (!args->Has("input")) return Fail(absl::InvalidArgumentError("--input: required (a file or -)"));
  if (!args->Has("d-model")) return Fail(absl::InvalidArgumentError("--d-model: required"));
  auto d_model = args->GetInt("d-model", 0, 1, CostModel::kMaxDModel);
  if (!d_model.ok()) return Fail(d_model.status());
  const std::string path = args->GetString("input", "-");
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    std::ifstream file(path);
    if (!file) return Fail(absl::InvalidArgumentError(absl::StrCat("--input: cannot read '", path, "'")));
    text.assign(std::istreambuf_iterator<char>(file), {});
  }
  auto samples = ParseTimingCsv(text, *d_model);
  if (!samples.ok()) return Fail(samples.status());
  auto fit = FitCostModel(*samples);
  if (!fit.ok()) return Fail(fit.status());
  std::cout << absl::StrFormat(
      "fit of seconds = k * (24*l*d^2 + gamma*4*l^2*d), d = %d, %d samples (relative least "
      "squares)\n"
      "gamma               %.4f\n"
      "k                   %.6g seconds per unit\n"
      "rmse                %.6g seconds\n"
      "r^2                 %.6f\n"
      "max relative error  %.2f%%\n",
      *d_model, fit->samples, fit->gamma, fit->k, fit->rmse_seconds, fit->r_squared,
      100 * fit->max_relative_error);
  return 0;
}

}  // namespace knapformer
