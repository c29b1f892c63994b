#include "tools/calibrate.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/args.h"
#include "planner/cost_model.h"
#include "common/status_macros.h"
#include "planner/plan_json.h"

namespace knapformer {

namespace {

const std::vector<OptionSpec>& CalibrateOptions() {
  static const std::vector<OptionSpec> kOptions = {
      {"input", "FILE|-", "", "rows \"length,seconds[,mask]\" (docs/planner.md); - reads stdin"},
      {"d-model", "D", "", "the model width the blocks were timed at (required with --input)"},
      {"table", "FILE", "", "with --input: also write the measured cost model's table"},
      {"exchanges", "FILE|-", "",
       "timed all-to-alls, rows \"gpus,bytes_per_gpu,seconds,intra|inter\""},
  };
  return kOptions;
}

}  // namespace

std::string CalibrateUsage() {
  return FormatUsage(
      "knapformer calibrate --input FILE|- --d-model D [--table FILE]\n"
      "knapformer calibrate --exchanges FILE|-",
      "With --input: fit the cost model's k and gamma (least squares, as in the paper) to\n"
      "measured latencies of one transformer block per sequence length. With --exchanges:\n"
      "fit the machine's intra- and inter-node bandwidths to timed all-to-alls, as\n"
      "bench/exchange_times.py writes them. A header row and # comments are skipped.\n"
      "--table FILE writes the measured cost model: the fit's linear term and each\n"
      "length's measured attention, interpolated (docs/planner.md).",
      CalibrateOptions());
}

namespace {

// Calls `row` with the whitespace-stripped fields and the number of every
// line of `text` that is not blank or a # comment. `row` answers false for
// fields not in `format` (on line 1: a header, skipped; elsewhere an error)
// or an error saying what is wrong with the values; errors name `flag` and
// the line.
template <typename Row>
absl::Status ForEachCsvRow(const std::string& text, absl::string_view flag,
                           absl::string_view format, Row&& row) {
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    for (absl::string_view& field : fields) field = absl::StripAsciiWhitespace(field);
    absl::StatusOr<bool> parsed = row(fields);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": line ", line_number, ": ", parsed.status().message()));
    }
    if (*parsed || line_number == 1) continue;  // a row, or a header
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": line ", line_number,
                                                   ": expected \"", format, "\", got \"", line,
                                                   "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<WorkSample>> ParseTimingCsv(const std::string& text, int64_t d_model) {
  std::vector<WorkSample> samples;
  KF_RETURN_IF_ERROR(ForEachCsvRow(
      text, "input", "length,seconds[,mask]",
      [&](const std::vector<absl::string_view>& fields) -> absl::StatusOr<bool> {
        int64_t length = 0;
        double seconds = 0;
        if ((fields.size() != 2 && fields.size() != 3) || !absl::SimpleAtoi(fields[0], &length) ||
            !absl::SimpleAtod(fields[1], &seconds)) {
          return false;
        }
        // SimpleAtod reads "2e9400" as infinity: a time, like a NaN, that no
        // fit can use.
        if (length < 1 || length > CostModel::kMaxLength || !(seconds >= 0) ||
            !std::isfinite(seconds)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "length must be in [1, ", CostModel::kMaxLength, "] and seconds finite and >= 0"));
        }
        // A row may name the mask its block attended with: the fit is
        // against the pairs attended, A, not l^2.
        AttentionMask mask;
        if (fields.size() == 3) {
          KF_ASSIGN_OR_RETURN(
              mask, ParseMaskText(std::string(absl::StripAsciiWhitespace(fields[2])), "mask"));
          KF_RETURN_IF_ERROR(CheckMask(length, mask, "mask"));
        }
        samples.push_back(SequenceSample(length, d_model, seconds, &mask));
        return true;
      }));
  return samples;
}

absl::StatusOr<std::vector<ExchangeSample>> ParseExchangeCsv(const std::string& text) {
  std::vector<ExchangeSample> samples;
  KF_RETURN_IF_ERROR(ForEachCsvRow(
      text, "exchanges", "gpus,bytes_per_gpu,seconds,intra|inter",
      [&](const std::vector<absl::string_view>& fields) -> absl::StatusOr<bool> {
        ExchangeSample sample;
        if (fields.size() != 4 || !absl::SimpleAtoi(fields[0], &sample.gpus) ||
            !absl::SimpleAtod(fields[1], &sample.bytes_per_gpu) ||
            !absl::SimpleAtod(fields[2], &sample.seconds) ||
            (fields[3] != "intra" && fields[3] != "inter")) {
          return false;
        }
        sample.inter_node = fields[3] == "inter";
        if (sample.gpus < 2 || sample.gpus > 65536 || !(sample.bytes_per_gpu >= 0) ||
            !std::isfinite(sample.bytes_per_gpu) || !(sample.seconds > 0) ||
            !std::isfinite(sample.seconds)) {
          return absl::InvalidArgumentError(
              "gpus must be in [2, 65536], bytes finite and >= 0, seconds finite and > 0");
        }
        samples.push_back(sample);
        return true;
      }));
  return samples;
}

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "knapformer calibrate: " << status.message() << "\n";
  return 2;
}

absl::StatusOr<std::string> ReadInput(const std::string& flag, const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::ifstream file(path);
  if (!file) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read '", path, "'"));
  }
  return std::string(std::istreambuf_iterator<char>(file), {});
}

std::string LinkLine(const char* name, const std::optional<LinkFit>& fit) {
  if (!fit.has_value()) return absl::StrFormat("%-11s not measured (keeps its default)\n", name);
  return absl::StrFormat(
      "%-11s %.4g bytes/s (%.4g GB/s), latency %.3g us (not priced), %d samples, r^2 %.4f, "
      "max relative error %.1f%%\n",
      name, fit->bytes_per_second, fit->bytes_per_second / 1e9, fit->latency_seconds * 1e6,
      fit->samples, fit->r_squared, 100 * fit->max_relative_error);
}

int RunExchanges(const std::string& text) {
  auto samples = ParseExchangeCsv(text);
  if (!samples.ok()) return Fail(samples.status());
  if (samples->empty()) {
    return Fail(absl::InvalidArgumentError(
        "--exchanges: no rows \"gpus,bytes_per_gpu,seconds,intra|inter\" to fit"));
  }
  auto fit = FitExchanges(*samples);
  if (!fit.ok()) return Fail(absl::Status(fit.status().code(),
                                          absl::StrCat("--exchanges: ", fit.status().message())));
  std::vector<std::string> fields, flags;
  if (fit->intra_node.has_value()) {
    fields.push_back(absl::StrFormat("\"intra_node_bytes_per_second\": %.4g",
                                     fit->intra_node->bytes_per_second));
    flags.push_back(absl::StrFormat("--intra-node-gbps %.4g", fit->intra_node->bytes_per_second / 1e9));
  }
  if (fit->inter_node.has_value()) {
    fields.push_back(absl::StrFormat("\"inter_node_bytes_per_second\": %.4g",
                                     fit->inter_node->bytes_per_second));
    flags.push_back(absl::StrFormat("--inter-node-gbps %.4g", fit->inter_node->bytes_per_second / 1e9));
  }
  std::cout << "fit of seconds = latency + (gpus-1)/gpus * bytes_per_gpu / bandwidth, per link "
               "(relative least squares)\n"
            << LinkLine("intra-node", fit->intra_node) << LinkLine("inter-node", fit->inter_node)
            << "machine     {" << absl::StrJoin(fields, ", ") << "}\n"
            << "flags       " << absl::StrJoin(flags, " ") << "\n";
  return 0;
}

}  // namespace

int RunCalibrate(const std::vector<std::string>& argv) {
  if (Args::WantsHelp(argv)) {
    std::cout << CalibrateUsage();
    return 0;
  }
  auto args = Args::ParseOptions(argv, CalibrateOptions());
  if (!args.ok()) return Fail(args.status());
  if (args->Has("exchanges")) {
    if (args->Has("input") || args->Has("d-model") || args->Has("table")) {
      return Fail(absl::InvalidArgumentError(
          "--exchanges: fits the links alone; --input and --d-model fit the compute (run "
          "calibrate once for each)"));
    }
    auto text = ReadInput("exchanges", args->GetString("exchanges", "-"));
    if (!text.ok()) return Fail(text.status());
    return RunExchanges(*text);
  }
  if (!args->Has("input")) {
    return Fail(absl::InvalidArgumentError("--input: required (a file or -), or --exchanges"));
  }
  if (!args->Has("d-model")) return Fail(absl::InvalidArgumentError("--d-model: required"));
  auto d_model = args->GetInt("d-model", 0, 1, CostModel::kMaxDModel);
  if (!d_model.ok()) return Fail(d_model.status());
  auto text = ReadInput("input", args->GetString("input", "-"));
  if (!text.ok()) return Fail(text.status());
  auto samples = ParseTimingCsv(*text, *d_model);
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
  if (args->Has("table")) {
    const std::string path = args->GetString("table", "");
    auto attention = MeasuredAttentionFromSamples(*samples, *fit, *d_model);
    if (!attention.ok()) return Fail(attention.status());
    // How the table prices the samples, against the fit's straight line.
    double worst = 0;
    for (const WorkSample& s : *samples) {
      if (s.seconds <= 0) continue;
      const double pairs = s.attention / (4.0 * static_cast<double>(*d_model));
      const double predicted = fit->k * (s.linear + attention->Work(pairs));
      worst = std::max(worst, std::abs(predicted - s.seconds) / s.seconds);
    }
    const std::string text = CostTableToJson(CostTable{*d_model, fit->k, fit->gamma, *attention});
    std::ofstream out(path);
    out << text;
    out.close();
    if (!out) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--table: cannot write '", path, "'")));
    }
    std::cout << absl::StrFormat(
        "measured table      %d attention sizes written to %s, max relative error %.2f%%\n"
        "                    (plan with --cost-model measured --cost-table %s)\n",
        attention->pairs().size(), path, 100 * worst, path);
  }
  return 0;
}

}  // namespace knapformer
