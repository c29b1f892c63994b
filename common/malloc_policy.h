#ifndef KNAPFORMER_COMMON_MALLOC_POLICY_H_
#define KNAPFORMER_COMMON_MALLOC_POLICY_H_

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

// Stronger, for processes that time their own compute (train-sim's ranks):
// no block of any size is mmap'd and no free heap top is ever trimmed, so
// after the first step every tensor reuses memory that is already mapped,
// as a GPU's caching allocator does. Why: a block above RetainFreedMemory's
// 32 MB (a 2048-token attention map of 8 heads is 128 MB) that no free heap
// space fits is mmap'd fresh, and with glibc's defaults faulting such
// blocks in was up to 45% of a rank's thread CPU time
// in train-sim (8 processes, 490 ms of 1.5 s), landing on whichever ranks
// last grew their heap: equally loaded ranks of one bag measured up to 2.7x
// apart.
// The process keeps its peak heap until it exits.
absl::Status KeepAllFreedMemory();

inline constexpr long kMallocRetainMmapThreshold = 32L << 20;   // glibc's largest
inline constexpr long kMallocRetainTrimThreshold = 512L << 20;

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_MALLOC_POLICY_H_
