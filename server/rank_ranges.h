#ifndef KNAPFORMER_SERVER_RANK_RANGES_H_
#define KNAPFORMER_SERVER_RANK_RANGES_H_

#include <cstddef>
#include <string>
#include <vector>

namespace knapformer {

// The ranks r with present[r] == false as ranges, "0-3,7,9-12", cut after
// about `max_chars` characters with " and N more" so a message naming the
// missing ranks of a 16384-rank group stays readable.
std::string MissingRankRanges(const std::vector<bool>& present, size_t max_chars = 1000);

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_RANK_RANGES_H_
