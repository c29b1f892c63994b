#include "planner/attention_mask.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace knapformer {
namespace {

double Triangle(double n) { return n * (n + 1) / 2; }

}  // namespace

double AttendedPairs(int64_t length, const AttentionMask& mask) {
  const double l = static_cast<double>(length);
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      return l * l;
    case AttentionMask::Kind::kCausal:
      return Triangle(l);
    case AttentionMask::Kind::kWindow: {
      // Tokens 0..w-1 see i+1 keys, the rest w each.
      const int64_t ramp = std::min(length, mask.window);
      const double w = static_cast<double>(mask.window);
      return Triangle(static_cast<double>(ramp)) + static_cast<double>(length - ramp) * w;
    }
    case AttentionMask::Kind::kSpans: {
      double pairs = 0, before = 0;
      for (const MaskSpan& span : mask.spans) {
        const double n = static_cast<double>(span.length);
        pairs += n * before + (span.causal ? Triangle(n) : n * n);
        before += n;
      }
      return pairs;
    }
  }
  return l * l;
}

absl::Status CheckMask(int64_t length, const AttentionMask& mask, const std::string& field) {
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
    case AttentionMask::Kind::kCausal:
      return absl::OkStatus();
    case AttentionMask::Kind::kWindow:
      if (mask.window < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".window: must be at least 1, got ", mask.window));
      }
      return absl::OkStatus();
    case AttentionMask::Kind::kSpans: {
      const int64_t count = static_cast<int64_t>(mask.spans.size());
      if (count == 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".spans: must not be empty"));
      }
      if (count > AttentionMask::kMaxSpans) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".spans: ", count,
                                                       " spans exceed the limit of ",
                                                       AttentionMask::kMaxSpans));
      }
      int64_t sum = 0;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t n = mask.spans[j].length;
        if (n < 1 || n > length) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ".spans[", j, "]: length must be in [1, ", length,
              "] (the sequence's length), got ", n));
        }
        if (n > length - sum) {  // checked before adding: no overflow, whatever length is
          return absl::InvalidArgumentError(absl::StrCat(
              field, ".spans: lengths add up to more than the sequence's ", length,
              " tokens by span ", j));
        }
        sum += n;
      }
      if (sum != length) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".spans: lengths add up to ", sum,
                                                       ", the sequence has ", length,
                                                       " tokens"));
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown mask kind ", static_cast<int>(mask.kind)));
}

absl::Status CheckMaskList(const std::vector<int64_t>& lengths,
                           const std::vector<AttentionMask>& masks, const std::string& field) {
  if (masks.empty()) return absl::OkStatus();
  if (masks.size() != lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", masks.size(), " masks for ", lengths.size(),
        " sequences (give one per sequence, or none at all)"));
  }
  for (size_t i = 0; i < masks.size(); ++i) {
    // The field's name only for the error: building it for every valid
    // mask was a tenth of checking 262,144 masks.
    if (!CheckMask(lengths[i], masks[i], std::string()).ok()) {
      return CheckMask(lengths[i], masks[i], absl::StrCat(field, "[", i, "]"));
    }
  }
  return absl::OkStatus();
}

std::string MasksField(size_t rank) { return absl::StrCat("masks[", rank, "]"); }

absl::Status CheckRankMasks(const std::vector<std::vector<int64_t>>& lengths,
                            const RankMasks& masks, const RankField& field) {
  if (masks.empty()) return absl::OkStatus();
  if (masks.size() != lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("masks: got masks for ", masks.size(),
                                                   " ranks, there are ", lengths.size()));
  }
  for (size_t rank = 0; rank < masks.size(); ++rank) {
    // A rank without masks among ranks with them is refused too.
    if (masks[rank].empty() && !lengths[rank].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field(rank), ": 0 masks for ", lengths[rank].size(),
          " sequences (give one per sequence, on every rank, or none at all)"));
    }
    if (!CheckMaskList(lengths[rank], masks[rank], std::string()).ok()) {
      return CheckMaskList(lengths[rank], masks[rank], field(rank));
    }
  }
  return absl::OkStatus();
}

std::string MaskText(const AttentionMask& mask) {
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      return "full";
    case AttentionMask::Kind::kCausal:
      return "causal";
    case AttentionMask::Kind::kWindow:
      return absl::StrCat("window=", mask.window);
    case AttentionMask::Kind::kSpans: {
      std::string text = "spans=";
      for (size_t j = 0; j < mask.spans.size(); ++j) {
        absl::StrAppend(&text, j > 0 ? ";" : "", mask.spans[j].length,
                        mask.spans[j].causal ? ":c" : ":f");
      }
      return text;
    }
  }
  return "full";
}

absl::StatusOr<AttentionMask> ParseMaskText(const std::string& text, const std::string& field) {
  if (text == "full") return AttentionMask::Full();
  if (text == "causal") return AttentionMask::Causal();
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "window=")) {
    int64_t window = 0;
    if (!absl::SimpleAtoi(rest, &window) || window < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '", text, "': the window must be a whole number of keys >= 1"));
    }
    return AttentionMask::Window(window);
  }
  if (absl::ConsumePrefix(&rest, "spans=")) {
    std::vector<MaskSpan> spans;
    for (absl::string_view item : absl::StrSplit(rest, ';')) {
      if (static_cast<int64_t>(spans.size()) == AttentionMask::kMaxSpans) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": more than ",
                                                       AttentionMask::kMaxSpans, " spans"));
      }
      MaskSpan span;
      const bool causal = absl::ConsumeSuffix(&item, ":c");
      const bool full = !causal && absl::ConsumeSuffix(&item, ":f");
      if ((!causal && !full) || !absl::SimpleAtoi(item, &span.length) || span.length < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": span '", item, "' of '", text,
            "' is not n:f or n:c (n >= 1 tokens attended fully or causally)"));
      }
      span.causal = causal;
      spans.push_back(span);
    }
    return AttentionMask::Spans(std::move(spans));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unknown mask '", text, "' (full, causal, window=W or spans=n:f;n:c;...)"));
}

}  // namespace knapformer
