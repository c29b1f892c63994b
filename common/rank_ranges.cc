#include "common/rank_ranges.h"

#include "absl/strings/str_cat.h"

namespace knapformer {

std::string RankRanges(const std::vector<int>& ranks, absl::string_view separator,
                       size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t end = i;
    while (end + 1 < ranks.size() && ranks[end + 1] == ranks[end] + 1) ++end;
    if (out.size() >= max_chars) {
      absl::StrAppend(&out, " and ", ranks.size() - i, " more");
      return out;
    }
    if (!out.empty()) absl::StrAppend(&out, separator);
    absl::StrAppend(&out, ranks[i]);
    if (end > i) absl::StrAppend(&out, "-", ranks[end]);
    i = end + 1;
  }
  return out;
}

std::string MissingRankRanges(const std::vector<bool>& present, size_t max_chars) {
  std::vector<int> missing;
  for (size_t r = 0; r < present.size(); ++r) {
    if (!present[r]) missing.push_back(static_cast<int>(r));
  }
  return RankRanges(missing, ",", max_chars);
}

}  // namespace knapformer
