#ifndef KNAPFORMER_PLANNER_COST_MODEL_H_
#define KNAPFORMER_PLANNER_COST_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "planner/attention_mask.h"
#include "planner/measured_cost.h"

namespace knapformer {

// The cost of one sequence of `l` tokens, in four kinds:
//  - transformer (the paper's per-block workload, embedding dimension d):
//    w(l) = 24*l*d^2 + gamma*4*l^2*d  (linear layers + attention; under an
//    attention mask l^2 becomes the pairs it attends, attention_mask.h). gamma
//    corrects the attention term for being memory-bound; it is fitted per GPU
//    architecture (the paper uses 0.49 for FLUX on H100).
//  - uniform: every non-empty sequence costs 1 (a text encoder whose inputs
//    are padded to a fixed length, the paper's T5 balancer).
//  - linear: w(l) = l (per-token work such as VAE tiles).
//  - measured: the transformer's linear term and, for attention, a table
//    measured on the device (measured_cost.h), interpolated by the pairs
//    attended; in the transformer's units, so it is priced like it.
// All four are Linear(tokens) (splits evenly over the tokens of a chunk) +
// Attention(length) (shared by a bag's GPUs).
//
// Arithmetic is double: 24*l*d^2 alone reaches 2.3e20 at l = 2^31, d = 65536,
// beyond int64, while double keeps ~16 significant digits, enough to rank and
// sum workloads. Results are deterministic for a given binary.
enum class CostKind { kTransformer, kUniform, kLinear, kMeasured };

// "transformer", "uniform", "linear", "measured"; InvalidArgument naming
// `field` else.
absl::StatusOr<CostKind> ParseCostKind(const std::string& name, const std::string& field);
const char* CostKindName(CostKind kind);
// Whether the kind's work is in FLOPs (transformer, measured): what
// communication is priced against (machine.h) and what auto needs.
bool PricedInFlops(CostKind kind);

class CostModel {
 public:
  static constexpr int64_t kMaxLength = int64_t{1} << 31;  // tokens per sequence
  static constexpr int64_t kMaxDModel = 65536;

  // InvalidArgument unless 1 <= d_model <= kMaxDModel and gamma is finite and
  // in [0, 1e6], and unless `measured` is given exactly for kMeasured.
  // The transformer model. Uniform, linear and measured ignore gamma (and
  // the first two d_model), but they are checked all the same (a spec is
  // valid whatever its kind).
  static absl::StatusOr<CostModel> Create(int64_t d_model, double gamma,
                                          CostKind kind = CostKind::kTransformer,
                                          const MeasuredAttention* measured = nullptr);

  CostKind kind() const { return kind_; }
  int64_t d_model() const { return d_model_; }
  double gamma() const { return gamma_; }
  // The measured attention table (kMeasured), else null.
  const MeasuredAttention* measured() const { return measured_.get(); }

  // The part that splits evenly over the tokens of a chunk (transformer:
  // 24*tokens*d^2).
  double Linear(int64_t tokens) const { return per_token_ * static_cast<double>(tokens); }
  // The part of a whole sequence of `length` tokens that a bag's GPUs share
  // (transformer: gamma*4*l^2*d, attention, which Ulysses spreads by heads).
  double Attention(int64_t length) const {
    const double l = static_cast<double>(length);
    if (measured_ != nullptr) return measured_->Work(l * l);
    return per_token_squared_ * l * l + (length > 0 ? per_sequence_ : 0.0);
  }
  double Workload(int64_t length) const { return Linear(length) + Attention(length); }
  // The same under an attention mask: the attention term scales with the
  // pairs the mask attends (gamma*4*d*A, attention_mask.h). A null or full
  // mask gives exactly the unmasked figures above.
  double Attention(int64_t length, const AttentionMask* mask) const {
    if (mask == nullptr || mask->kind == AttentionMask::Kind::kFull) return Attention(length);
    if (measured_ != nullptr) return measured_->Work(AttendedPairs(length, *mask));
    return per_token_squared_ * AttendedPairs(length, *mask) + (length > 0 ? per_sequence_ : 0.0);
  }
  double Workload(int64_t length, const AttentionMask* mask) const {
    return Linear(length) + Attention(length, mask);
  }
  // The attention of a sequence that attends `pairs` (query, key) pairs (l*l
  // for a full one of l tokens): what a share of a bag's heads costs, priced
  // without its mask (knapformer replay).
  double AttentionOfPairs(double pairs) const {
    if (measured_ != nullptr) return measured_->Work(pairs);
    return per_token_squared_ * pairs + (pairs > 0 ? per_sequence_ : 0.0);
  }

 private:
  CostModel(CostKind kind, int64_t d_model, double gamma, double per_token,
            double per_token_squared, double per_sequence,
            std::shared_ptr<const MeasuredAttention> measured = nullptr)
      : kind_(kind),
        d_model_(d_model),
        gamma_(gamma),
        per_token_(per_token),
        per_token_squared_(per_token_squared),
        per_sequence_(per_sequence),
        measured_(std::move(measured)) {}

  CostKind kind_;
  int64_t d_model_;
  double gamma_;
  double per_token_;
  double per_token_squared_;
  double per_sequence_;
  // Shared: a model is copied into every solve; the table never changes.
  std::shared_ptr<const MeasuredAttention> measured_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_COST_MODEL_H_
