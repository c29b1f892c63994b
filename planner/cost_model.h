#ifndef KNAPFORMER_PLANNER_COST_MODEL_H_
#define KNAPFORMER_PLANNER_COST_MODEL_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace knapformer {

// The paper's per-block workload of one sequence of `l` tokens with embedding
// dimension d:  w(l) = 24*l*d^2 + gamma*4*l^2*d  (linear layers + attention).
// gamma corrects the attention term for being memory-bound; it is fitted per
// GPU architecture (the paper uses 0.49 for FLUX on H100).
//
// Arithmetic is double: 24*l*d^2 alone reaches 2.3e20 at l = 2^31, d = 65536,
// beyond int64, while double keeps ~16 significant digits, enough to rank and
// sum workloads. Results are deterministic for a given binary.
class CostModel {
 public:
  static constexpr int64_t kMaxLength = int64_t{1} << 31;  // tokens per sequence
  static constexpr int64_t kMaxDModel = 65536;

  // InvalidArgument unless 1 <= d_model <= kMaxDModel and gamma is finite and
  // in [0, 1e6].
  static absl::StatusOr<CostModel> Create(int64_t d_model, double gamma);

  int64_t d_model() const { return d_model_; }
  double gamma() const { return gamma_; }

  // 24*tokens*d^2: the part that splits evenly over the tokens of a chunk.
  double Linear(int64_t tokens) const {
    return 24.0 * static_cast<double>(tokens) * d_squared_;
  }
  // gamma*4*l^2*d: attention over a whole sequence of `length` tokens (Ulysses
  // spreads it over the bag's GPUs by heads).
  double Attention(int64_t length) const {
    const double l = static_cast<double>(length);
    return gamma_ * 4.0 * l * l * d_;
  }
  double Workload(int64_t length) const { return Linear(length) + Attention(length); }

 private:
  CostModel(int64_t d_model, double gamma)
      : d_model_(d_model),
        gamma_(gamma),
        d_(static_cast<double>(d_model)),
        d_squared_(static_cast<double>(d_model) * static_cast<double>(d_model)) {}

  int64_t d_model_;
  double gamma_;
  double d_;
  double d_squared_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_COST_MODEL_H_
