#include "server/rank_ranges.h"

#include "absl/strings/str_cat.h"

namespace knapformer {

std::string MissingRankRanges(const std::vector<bool>& present, size_t max_chars) {
  std::string out;
  const size_t n = present.size();
  size_t r = 0;
  while (r < n) {
    if (present[r]) {
      ++r;
      continue;
    }
    size_t end = r;
    while (end + 1 < n && !present[end + 1]) ++end;
    if (out.size() >= max_chars) {
      size_t rest = 0;
      for (size_t i = r; i < n; ++i) rest += present[i] ? 0 : 1;
      absl::StrAppend(&out, " and ", rest, " more");
      return out;
    }
    if (!out.empty()) out += ',';
    absl::StrAppend(&out, r);
    if (end > r) absl::StrAppend(&out, "-", end);
    r = end + 1;
  }
  return out;
}

}  // namespace knapformer
