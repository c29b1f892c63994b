#ifndef KNAPFORMER_PLANNER_MASK_JSON_H_
#define KNAPFORMER_PLANNER_MASK_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"
#include "planner/attention_mask.h"

namespace knapformer {

// The JSON forms of one mask, shared by `knapformer plan` and the Python
// API: "full", "causal", {"window": W}, {"spans": [[n, "full"|"causal"], ...]}.
// InvalidArgument naming `field` ("masks[1][0].spans[2]") for any other
// form; the values are checked against the sequence's length later
// (CheckMask), where it is known.
absl::StatusOr<AttentionMask> MaskFromJson(const nlohmann::json& value, const std::string& field);

// "masks": an array with one array of masks per rank.
absl::StatusOr<RankMasks> RankMasksFromJson(const nlohmann::json& value,
                                            const std::string& field = "masks");

// The same from JSON text (the Python binding's entry).
absl::StatusOr<RankMasks> ParseRankMasksJson(absl::string_view text,
                                             const std::string& field = "masks");
absl::StatusOr<AttentionMask> ParseMaskJson(absl::string_view text, const std::string& field);
// One rank's masks: an array of masks, field[i] naming each.
absl::StatusOr<std::vector<AttentionMask>> ParseMaskListJson(absl::string_view text,
                                                             const std::string& field);

// The JSON text of one mask, in the first of the forms above that fits.
std::string MaskToJson(const AttentionMask& mask);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_MASK_JSON_H_
