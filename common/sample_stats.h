#ifndef KNAPFORMER_COMMON_SAMPLE_STATS_H_
#define KNAPFORMER_COMMON_SAMPLE_STATS_H_

// Order statistics of timing samples, as train-sim and the benchmarks
// report them.

#include <vector>

namespace knapformer {

// Nearest-rank percentile of unsorted samples, q in (0, 1]: the smallest
// sample with at least q of the samples at or below it. NaN when empty.
double Percentile(std::vector<double> samples, double q);

// The median (the mean of the middle two of an even count). NaN when empty.
double Median(std::vector<double> samples);

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_SAMPLE_STATS_H_
