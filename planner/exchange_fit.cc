#include "planner/exchange_fit.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/least_squares.h"

namespace knapformer {
namespace {

struct Point {
  double sent = 0;
  double seconds = 0;
};

absl::StatusOr<LinkFit> FitLink(const std::vector<Point>& points, const char* link) {
  double low = points.front().sent, high = low;
  for (const Point& p : points) {
    low = std::min(low, p.sent);
    high = std::max(high, p.sent);
    if (!(p.seconds > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          link, ": a time of 0 seconds cannot be fitted (relative residuals)"));
    }
  }
  if (!(high > low * (1 + 1e-9))) {
    return absl::InvalidArgumentError(absl::StrCat(
        link, ": every sample sends the same bytes; time at least two sizes to tell the "
              "latency from the bandwidth"));
  }
  // Weighted least squares of seconds = a + b * sent with weights 1/seconds^2
  // (relative residuals); columns 0 (a) and 1 (b).
  NormalEquations equations(2);
  for (const Point& p : points) {
    equations.AddRow({1.0, p.sent}, p.seconds, 1.0 / (p.seconds * p.seconds));
  }
  absl::StatusOr<std::vector<double>> solved = equations.Solve();
  // Through the origin where the latency comes out negative, or the sizes
  // are too close to tell it from the bandwidth.
  if (!solved.ok() || (*solved)[0] < 0) solved = equations.Solve({1});
  const double a = solved.ok() ? (*solved)[0] : 0;
  const double b = solved.ok() ? (*solved)[1] : std::nan("");
  if (!(b > 0) || !std::isfinite(b)) {
    return absl::FailedPreconditionError(absl::StrCat(
        link, ": the times do not grow with the bytes sent (fitted seconds per byte ", b, ")"));
  }
  LinkFit fit;
  fit.bytes_per_second = 1.0 / b;
  fit.latency_seconds = a;
  fit.samples = static_cast<int64_t>(points.size());
  double mean = 0;
  for (const Point& p : points) mean += p.seconds;
  mean /= static_cast<double>(points.size());
  double sse = 0, sst = 0;
  for (const Point& p : points) {
    const double residual = p.seconds - (a + b * p.sent);
    sse += residual * residual;
    sst += (p.seconds - mean) * (p.seconds - mean);
    fit.max_relative_error = std::max(fit.max_relative_error, std::abs(residual) / p.seconds);
  }
  fit.r_squared = sst > 0 ? 1 - sse / sst : 1.0;
  return fit;
}

}  // namespace

absl::StatusOr<ExchangeFit> FitExchanges(const std::vector<ExchangeSample>& samples) {
  if (samples.empty()) return absl::InvalidArgumentError("samples: none to fit");
  std::vector<Point> intra, inter;
  for (size_t i = 0; i < samples.size(); ++i) {
    const ExchangeSample& s = samples[i];
    if (s.gpus < 2 || s.gpus > 65536) {
      return absl::InvalidArgumentError(
          absl::StrCat("samples[", i, "].gpus: ", s.gpus, " is outside [2, 65536]"));
    }
    if (!(s.bytes_per_gpu >= 0) || !std::isfinite(s.bytes_per_gpu) || !(s.seconds >= 0) ||
        !std::isfinite(s.seconds)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "samples[", i, "]: bytes and seconds must be finite and >= 0"));
    }
    const double sent = s.bytes_per_gpu * (s.gpus - 1) / s.gpus;
    (s.inter_node ? inter : intra).push_back({sent, s.seconds});
  }
  ExchangeFit fit;
  if (!intra.empty()) {
    absl::StatusOr<LinkFit> link = FitLink(intra, "intra-node");
    if (!link.ok()) return link.status();
    fit.intra_node = *link;
  }
  if (!inter.empty()) {
    absl::StatusOr<LinkFit> link = FitLink(inter, "inter-node");
    if (!link.ok()) return link.status();
    fit.inter_node = *link;
  }
  return fit;
}

}  // namespace knapformer
