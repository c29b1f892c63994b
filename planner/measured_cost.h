#ifndef KNAPFORMER_PLANNER_MEASURED_COST_H_
#define KNAPFORMER_PLANNER_MEASURED_COST_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace knapformer {

// The attention term of the measured cost model (CostKind::kMeasured): what
// one device's attention of a sequence took, by the pairs (query, key) it
// attends, as points measured by `knapformer calibrate --table`. Work is in
// the transformer model's units (FLOP-equivalents: the measured seconds
// over the seconds per unit the calibration fitted, k), so the linear term
// stays 24*l*d^2 and communication is priced as for the transformer model.
// Between points the work is interpolated linearly, from (0, 0) to the
// first; past the last it grows in proportion to the pairs, as attention
// does once the kernel is compute-bound. Why: the model's gamma*4*l^2*d is
// one straight line in the pairs, while measured kernels are far from it
// at short lengths (launch and memory bound) and bend where tiles fill.
class MeasuredAttention {
 public:
  static constexpr int kMaxPoints = 1024;

  // `pairs` strictly increasing and > 0, `work` >= 0 and nondecreasing
  // (longer attention never costs less), both finite, of the same size in
  // [1, kMaxPoints]; InvalidArgument naming `field`.pairs[i] / .work[i]
  // otherwise.
  static absl::StatusOr<MeasuredAttention> Create(std::vector<double> pairs,
                                                  std::vector<double> work,
                                                  const std::string& field);

  // The interpolated work of attending `pairs` pairs (0 for none).
  double Work(double pairs) const;

  const std::vector<double>& pairs() const { return pairs_; }
  const std::vector<double>& work() const { return work_; }

 private:
  MeasuredAttention(std::vector<double> pairs, std::vector<double> work)
      : pairs_(std::move(pairs)), work_(std::move(work)) {}

  std::vector<double> pairs_;
  std::vector<double> work_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_MEASURED_COST_H_
