#ifndef KNAPFORMER_PLANNER_SPLITMIX64_H_
#define KNAPFORMER_PLANNER_SPLITMIX64_H_

#include <cstdint>

namespace knapformer {

// SplitMix64: a tiny, well-mixed generator whose output is fixed by its
// definition (std::uniform_*_distribution is not, across standard libraries),
// so seeded data is the same everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // U[0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // U{0 .. n-1}, unbiased (the short last stripe is rejected). REQUIRES: n > 0.
  uint64_t Below(uint64_t n) {
    const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
    uint64_t x;
    do x = Next(); while (x >= limit);
    return x % n;
  }

 private:
  uint64_t state_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_SPLITMIX64_H_
