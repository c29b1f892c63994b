#ifndef KNAPFORMER_COMMON_RANK_RANGES_H_
#define KNAPFORMER_COMMON_RANK_RANGES_H_

// Ranks in messages, as ranges: one formatter for the service's and the
// ranks' errors alike.

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace knapformer {

// `ranks` (ascending) as ranges joined by `separator`: "0-3,7,9-12", cut
// after about `max_chars` characters with " and N more" so a message naming
// the ranks of a 16384-rank group stays readable.
std::string RankRanges(const std::vector<int>& ranks, absl::string_view separator = ",",
                       size_t max_chars = 1000);

// The ranks r with present[r] == false, as RankRanges writes them.
std::string MissingRankRanges(const std::vector<bool>& present, size_t max_chars = 1000);

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_RANK_RANGES_H_
