#include "planner/exchange_fit.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace knapformer {
namespace {

struct Point {
  double sent = 0;
  double seconds = 0;
};

// Weighted least squares of seconds = a + b * sent with weights 1/seconds^2
// (relative residuals); through the origin when `with_latency` is false.
void Solve(const std::vector<Point>& points, bool with_latency, double* a, double* b) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Point& p : points) {
    const double w = 1.0 / (p.seconds * p.seconds);
    sw += w;
    sx += w * p.sent;
    sy += w * p.seconds;
    sxx += w * p.sent * p.sent;
    sxy += w * p.sent * p.seconds;
  }
  if (with_latency) {
    const double det = sw * sxx - sx * sx;
    *b = (sw * sxy - sx * sy) / det;
    *a = (sy - *b * sx) / sw;
  } else {
    *a = 0;
    *b = sxy / sxx;
  }
}

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
  double a = 0, b = 0;
  Solve(points, /*with_latency=*/true, &a, &b);
  if (a < 0) Solve(points, /*with_latency=*/false, &a, &b);
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
