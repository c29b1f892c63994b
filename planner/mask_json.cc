#include "planner/mask_json.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace knapformer {
namespace {

using nlohmann::json;

constexpr char kForms[] =
    "\"full\", \"causal\", {\"window\": W} or {\"spans\": [[n, \"full\"|\"causal\"], ...]}";

absl::Status FieldError(const std::string& field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// An integer JSON value that fits int64 (larger ones are refused later by
// the range checks, so they read as the largest int64).
bool IntegerOf(const json& value, int64_t* out) {
  if (!value.is_number_integer()) return false;
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    *out = INT64_MAX;
  } else {
    *out = value.get<int64_t>();
  }
  return true;
}

absl::StatusOr<json> ParseText(absl::string_view text, const std::string& field) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception&) {
    return FieldError(field, "not valid JSON");
  }
}

}  // namespace

absl::StatusOr<AttentionMask> MaskFromJson(const json& value, const std::string& field) {
  if (value.is_string()) {
    const std::string& name = value.get_ref<const std::string&>();
    if (name == "full") return AttentionMask::Full();
    if (name == "causal") return AttentionMask::Causal();
    return FieldError(field, absl::StrCat("unknown mask kind '", name, "' (expected ", kForms,
                                          ")"));
  }
  if (!value.is_object() || value.size() != 1) {
    return FieldError(field, absl::StrCat("must be one of ", kForms));
  }
  const auto item = value.items().begin();
  if (item.key() == "window") {
    int64_t window = 0;
    if (!IntegerOf(item.value(), &window)) {
      return FieldError(field + ".window", "must be an integer number of keys");
    }
    if (window < 1) {
      return FieldError(field + ".window", absl::StrCat("must be at least 1, got ", window));
    }
    return AttentionMask::Window(window);
  }
  if (item.key() != "spans") {
    return FieldError(field, absl::StrCat("unknown mask kind '", item.key(), "' (expected ",
                                          kForms, ")"));
  }
  const json& spans = item.value();
  const std::string spans_field = field + ".spans";
  if (!spans.is_array()) return FieldError(spans_field, "must be an array of [n, kind] pairs");
  if (spans.empty()) return FieldError(spans_field, "must not be empty");
  if (static_cast<int64_t>(spans.size()) > AttentionMask::kMaxSpans) {
    return FieldError(spans_field, absl::StrCat(spans.size(), " spans exceed the limit of ",
                                                AttentionMask::kMaxSpans));
  }
  std::vector<MaskSpan> parsed;
  parsed.reserve(spans.size());
  for (size_t j = 0; j < spans.size(); ++j) {
    const std::string span_field = absl::StrCat(spans_field, "[", j, "]");
    const json& span = spans[j];
    if (!span.is_array() || span.size() != 2) {
      return FieldError(span_field, "must be a pair [n, \"full\"|\"causal\"]");
    }
    int64_t n = 0;
    if (!IntegerOf(span[0], &n)) return FieldError(span_field, "length must be an integer");
    if (n < 1) return FieldError(span_field, absl::StrCat("length must be at least 1, got ", n));
    if (!span[1].is_string() ||
        (span[1].get_ref<const std::string&>() != "full" &&
         span[1].get_ref<const std::string&>() != "causal")) {
      return FieldError(span_field,
                        absl::StrCat("unknown span kind ", span[1].dump(),
                                     " (expected \"full\" or \"causal\")"));
    }
    parsed.push_back(MaskSpan{n, span[1].get_ref<const std::string&>() == "causal"});
  }
  return AttentionMask::Spans(std::move(parsed));
}

absl::StatusOr<RankMasks> RankMasksFromJson(const json& value, const std::string& field) {
  if (!value.is_array()) return FieldError(field, "must be an array of arrays of masks");
  RankMasks masks(value.size());
  for (size_t r = 0; r < value.size(); ++r) {
    const std::string rank_field = absl::StrCat(field, "[", r, "]");
    if (!value[r].is_array()) return FieldError(rank_field, "must be an array of masks");
    masks[r].reserve(value[r].size());
    for (size_t i = 0; i < value[r].size(); ++i) {
      absl::StatusOr<AttentionMask> mask =
          MaskFromJson(value[r][i], absl::StrCat(rank_field, "[", i, "]"));
      if (!mask.ok()) return mask.status();
      masks[r].push_back(*std::move(mask));
    }
  }
  return masks;
}

absl::StatusOr<RankMasks> ParseRankMasksJson(absl::string_view text, const std::string& field) {
  absl::StatusOr<json> value = ParseText(text, field);
  if (!value.ok()) return value.status();
  return RankMasksFromJson(*value, field);
}

absl::StatusOr<AttentionMask> ParseMaskJson(absl::string_view text, const std::string& field) {
  absl::StatusOr<json> value = ParseText(text, field);
  if (!value.ok()) return value.status();
  return MaskFromJson(*value, field);
}

absl::StatusOr<std::vector<AttentionMask>> ParseMaskListJson(absl::string_view text,
                                                             const std::string& field) {
  absl::StatusOr<json> value = ParseText(text, field);
  if (!value.ok()) return value.status();
  if (!value->is_array()) return FieldError(field, "must be a list of masks");
  std::vector<AttentionMask> masks;
  masks.reserve(value->size());
  for (size_t i = 0; i < value->size(); ++i) {
    absl::StatusOr<AttentionMask> mask = MaskFromJson((*value)[i], absl::StrCat(field, "[", i, "]"));
    if (!mask.ok()) return mask.status();
    masks.push_back(*std::move(mask));
  }
  return masks;
}

std::string MaskToJson(const AttentionMask& mask) {
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      return "\"full\"";
    case AttentionMask::Kind::kCausal:
      return "\"causal\"";
    case AttentionMask::Kind::kWindow:
      return json{{"window", mask.window}}.dump();
    case AttentionMask::Kind::kSpans: {
      json spans = json::array();
      for (const MaskSpan& span : mask.spans) {
        spans.push_back(json::array({span.length, span.causal ? "causal" : "full"}));
      }
      return json{{"spans", std::move(spans)}}.dump();
    }
  }
  return "\"full\"";
}

}  // namespace knapformer
