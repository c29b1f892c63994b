#ifndef KNAPFORMER_PLANNER_ATTENTION_MASK_H_
#define KNAPFORMER_PLANNER_ATTENTION_MASK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace knapformer {

// Which (query, key) pairs of one sequence attend. A sequence's attention
// work is proportional to their number, AttendedPairs:
//  - full: every token attends to every token, l^2 (the paper's model);
//  - causal: token i attends to tokens 0..i, l(l+1)/2;
//  - window w: causal, each token sees at most its w latest keys itself
//    included, sum over i < l of min(i+1, w);
//  - spans [(n_1, k_1), ...] with n_1 + ... = l: block-causal, each span
//    attends fully to every earlier span and to itself fully (n_j^2) or
//    causally (n_j(n_j+1)/2). Chunked video (all full), interleaved causal
//    text and bidirectional images.
// Ulysses keeps whole sequences per head shard, so a bag's GPUs share a
// masked sequence's attention as they share a full one's.
struct MaskSpan {
  int64_t length = 0;
  bool causal = false;
  bool operator==(const MaskSpan& other) const {
    return length == other.length && causal == other.causal;
  }
};

struct AttentionMask {
  enum class Kind : uint8_t { kFull = 0, kCausal = 1, kWindow = 2, kSpans = 3 };

  // The most spans one sequence may have: a bound on request size and on the
  // work of pricing it, far past chunked video (a span per frame chunk) or
  // interleaved documents.
  static constexpr int64_t kMaxSpans = 4096;

  Kind kind = Kind::kFull;
  int64_t window = 0;            // kWindow: keys each token sees, >= 1
  std::vector<MaskSpan> spans;   // kSpans: in sequence order

  static AttentionMask Full() { return {}; }
  static AttentionMask Causal() { return {Kind::kCausal, 0, {}}; }
  static AttentionMask Window(int64_t window) { return {Kind::kWindow, window, {}}; }
  static AttentionMask Spans(std::vector<MaskSpan> spans) {
    return {Kind::kSpans, 0, std::move(spans)};
  }

  bool operator==(const AttentionMask& other) const {
    return kind == other.kind && window == other.window && spans == other.spans;
  }
  bool operator!=(const AttentionMask& other) const { return !(*this == other); }
};

// masks[rank][i]: the mask of sequence i of `rank`. Empty: every sequence
// attends fully (a step without masks, planned exactly as before masks).
using RankMasks = std::vector<std::vector<AttentionMask>>;

// The attended (query, key) pairs of a sequence of `length` tokens under
// `mask`, in double (exact below 2^53 pairs, within a rounding beyond).
// REQUIRES: CheckMask(length, mask) is ok.
double AttendedPairs(int64_t length, const AttentionMask& mask);

// InvalidArgument naming `field` ("masks[2][5]") unless `mask` is one of a
// sequence of `length` tokens: a window >= 1, spans that are non-empty, at
// most kMaxSpans, each of length >= 1, adding up to `length`.
absl::Status CheckMask(int64_t length, const AttentionMask& mask, const std::string& field);

// One rank's masks: none, or one per sequence of `lengths`, each valid.
// InvalidArgument naming "<field>" (the count) or "<field>[i]..." otherwise.
absl::Status CheckMaskList(const std::vector<int64_t>& lengths,
                           const std::vector<AttentionMask>& masks, const std::string& field);

// Names rank r's list in errors: "masks[3]" (MasksField), or a request's
// "ranks[3].attention_masks".
using RankField = std::function<std::string(size_t rank)>;
std::string MasksField(size_t rank);

// Every mask of a step: `masks` is empty, or has one list per rank of
// `lengths` with one mask per sequence (a rank with no sequences has an
// empty list). InvalidArgument naming "masks" (the count of lists),
// field(rank) or field(rank)[i]... otherwise.
absl::Status CheckRankMasks(const std::vector<std::vector<int64_t>>& lengths,
                            const RankMasks& masks, const RankField& field = MasksField);

// The mask of sequence i of `rank`, or nullptr when `masks` is null or empty
// (full attention).
inline const AttentionMask* MaskOf(const RankMasks* masks, size_t rank, size_t i) {
  return masks == nullptr || masks->empty() ? nullptr : &(*masks)[rank][i];
}

// "full", "causal", "window=W", "spans=n:f;n:c;..." (f full, c causal): the
// text form of a mask in one CSV field (knapformer calibrate's timing rows)
// and in messages.
std::string MaskText(const AttentionMask& mask);

// The inverse of MaskText; InvalidArgument naming `field` otherwise. The
// values are checked against a length by CheckMask.
absl::StatusOr<AttentionMask> ParseMaskText(const std::string& text, const std::string& field);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_ATTENTION_MASK_H_
