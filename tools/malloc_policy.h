#ifndef KNAPFORMER_TOOLS_MALLOC_POLICY_H_
#define KNAPFORMER_TOOLS_MALLOC_POLICY_H_

#include "absl/status/status.h"

namespace knapformer {

// Tells glibc's malloc to keep freed memory for reuse instead of handing it
// back to the kernel: blocks up to kMallocRetainMmapThreshold come from the
// heap (not a fresh mmap each), and up to kMallocRetainTrimThreshold of free
// heap top stays mapped.
//
// Why: a plan at thousands of ranks allocates and frees some 10 MB each
// step. With glibc's defaults that memory can go back to the kernel after
// every plan (how often depends on the sizes: its thresholds follow the
// largest block freed), and every page is faulted in again next step. On a
// virtual machine where a fault costs microseconds this more than doubled
// planning time at 4096 ranks x 16 sequences in one topology (README,
// "Planning time and memory"). The price is that the process keeps its peak
// heap. A process-wide choice: `knapformer serve` and the benchmarks make it
// at start-up; a library (the embeddable server, the client) must not.
//
// Internal if glibc refuses a setting (it never has on Debian's 2.36).
absl::Status RetainFreedMemory();

inline constexpr long kMallocRetainMmapThreshold = 32L << 20;   // glibc's largest
inline constexpr long kMallocRetainTrimThreshold = 512L << 20;

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_MALLOC_POLICY_H_
