#ifndef KNAPFORMER_TESTS_FUZZ_SEED_LENGTHS_H_
#define KNAPFORMER_TESTS_FUZZ_SEED_LENGTHS_H_

// The sequence lengths the seeds of the answer fuzzers were planned for
// (make_seeds), which those fuzzers rebuild from one header byte: small
// (one byte each), varied per rank, and one long sequence.

#include <cstdint>

#include "planner/plan.h"

namespace knapformer {

inline RankLengths SeedLengths(int32_t world_size, int seed) {
  RankLengths lengths(world_size);
  for (int32_t r = 0; r < world_size; ++r) {
    for (int i = 0; i < 1 + (r + seed) % 4; ++i) {
      lengths[r].push_back(1 + (r * 37 + i * 101 + seed * 13) % 200);
    }
  }
  lengths[seed % world_size].push_back(250);
  return lengths;
}

}  // namespace knapformer

#endif  // KNAPFORMER_TESTS_FUZZ_SEED_LENGTHS_H_
