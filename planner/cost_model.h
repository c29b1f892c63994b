#ifndef KNAPFORMER_PLANNER_COST_MODEL_H_
#define KNAPFORMER_PLANNER_COST_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "planner/attention_mask.h"

namespace knapformer {

// The cost of one sequence of `l` tokens, in three kinds:
//  - transformer (the paper's per-block workload, embedding dimension d):
//    w(l) = 24*l*d^2 + gamma*4*l^2*d  (linear layers + attention; under an
//    attention mask l^2 becomes the pairs it attends, attention_mask.h). gamma
//    corrects the attention term for being memory-bound; it is fitted per GPU
//    architecture (the paper uses 0.49 for FLUX on H100).
//  - uniform: every non-empty sequence costs 1 (a text encoder whose inputs
//    are padded to a fixed length, the paper's T5 balancer).
//  - linear: w(l) = l (per-token work such as VAE tiles).
// All three are Linear(tokens) (splits evenly over the tokens of a chunk) +
// Attention(length) (shared by a bag's GPUs).
//
// Arithmetic is double: 24*l*d^2 alone reaches 2.3e20 at l = 2^31, d = 65536,
// beyond int64, while double keeps ~16 significant digits, enough to rank and
// sum workloads. Results are deterministic for a given binary.
enum class CostKind { kTransformer, kUniform, kLinear };

// "transformer", "uniform", "linear"; InvalidArgument naming `field` else.
absl::StatusOr<CostKind> ParseCostKind(const std::string& name, const std::string& field);
const char* CostKindName(CostKind kind);

class CostModel {
 public:
  static constexpr int64_t kMaxLength = int64_t{1} << 31;  // tokens per sequence
  static constexpr int64_t kMaxDModel = 65536;

  // InvalidArgument unless 1 <= d_model <= kMaxDModel and gamma is finite and
  // in [0, 1e6].
  // The transformer model. Uniform and linear ignore d_model and gamma, but
  // they are checked all the same (a spec is valid whatever its kind).
  static absl::StatusOr<CostModel> Create(int64_t d_model, double gamma,
                                          CostKind kind = CostKind::kTransformer);

  CostKind kind() const { return kind_; }
  int64_t d_model() const { return d_model_; }
  double gamma() const { return gamma_; }

  // The part that splits evenly over the tokens of a chunk (transformer:
  // 24*tokens*d^2).
  double Linear(int64_t tokens) const { return per_token_ * static_cast<double>(tokens); }
  // The part of a whole sequence of `length` tokens that a bag's GPUs share
  // (transformer: gamma*4*l^2*d, attention, which Ulysses spreads by heads).
  double Attention(int64_t length) const {
    const double l = static_cast<double>(length);
    return per_token_squared_ * l * l + (length > 0 ? per_sequence_ : 0.0);
  }
  double Workload(int64_t length) const { return Linear(length) + Attention(length); }
  // The same under an attention mask: the attention term scales with the
  // pairs the mask attends (gamma*4*d*A, attention_mask.h). A null or full
  // mask gives exactly the unmasked figures above.
  double Attention(int64_t length, const AttentionMask* mask) const {
    if (mask == nullptr || mask->kind == AttentionMask::Kind::kFull) return Attention(length);
    return per_token_squared_ * AttendedPairs(length, *mask) + (length > 0 ? per_sequence_ : 0.0);
  }
  double Workload(int64_t length, const AttentionMask* mask) const {
    return Linear(length) + Attention(length, mask);
  }

 private:
  CostModel(CostKind kind, int64_t d_model, double gamma, double per_token,
            double per_token_squared, double per_sequence)
      : kind_(kind),
        d_model_(d_model),
        gamma_(gamma),
        per_token_(per_token),
        per_token_squared_(per_token_squared),
        per_sequence_(per_sequence) {}

  CostKind kind_;
  int64_t d_model_;
  double gamma_;
  double per_token_;
  double per_token_squared_;
  double per_sequence_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_COST_MODEL_H_
